// softverbs-dev-node: runs a program where /dev/infiniband/<DEV_NAME> is a character device.
// UCX lists a verbs device only if that path stat()s as a character device it may read and
// write; it never opens it (docs/ucx.md, section 1). `softverbs run` execs this helper, which
// gives the program a private mount namespace whose /dev is a tmpfs holding every entry of the
// real /dev (bind-mounted, so /dev/null, /dev/shm and /dev/pts are the real ones) plus
// infiniband/<DEV_NAME> as device 0:0, which any user may create since Linux 5.8. As root a
// mount namespace is enough; otherwise an unprivileged user namespace comes with it, and a
// second one maps the caller back to their own uid and gid before the exec. Nothing changes
// outside the namespace, and everything the program starts inherits it.
//   softverbs-dev-node DEV_NAME -- CMD [ARGS...]
// When no namespace can be had (a container without CAP_SYS_ADMIN, user namespaces off), one
// line on stderr says so and CMD runs all the same. Built static, so that the LD_PRELOAD and
// LD_LIBRARY_PATH meant for CMD (sanitizer runtimes, our libraries) do not touch it.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

constexpr const char* kDevDir = "/dev";
constexpr const char* kIbDir = "/dev/infiniband";

// A failed step: what was done and errno, for the one-line message.
struct Failure {
  std::string what;
  int error = 0;
};

bool fail(Failure& failure, std::string what) {
  failure.error = errno;
  failure.what = std::move(what);
  return false;
}

bool write_file(const char* path, const std::string& text, Failure& failure) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return fail(failure, std::string("open ") + path);
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (!ok) fail(failure, std::string("write ") + path);
  close(fd);
  return ok;
}

// Enters a new user namespace in which OUTER (our id in the parent namespace) is INNER.
bool enter_user_namespace(unsigned inner_uid, unsigned outer_uid, unsigned inner_gid,
                          unsigned outer_gid, Failure& failure) {
  if (unshare(CLONE_NEWUSER) != 0) return fail(failure, "unshare(CLONE_NEWUSER)");
  // An unprivileged gid_map needs setgroups denied first; it may already be (inherited).
  int fd = open("/proc/self/setgroups", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)!write(fd, "deny", 4);
    close(fd);
  }
  return write_file("/proc/self/uid_map", std::to_string(inner_uid) + " " + std::to_string(outer_uid) + " 1\n", failure) &&
         write_file("/proc/self/gid_map", std::to_string(inner_gid) + " " + std::to_string(outer_gid) + " 1\n", failure);
}

// Mounts a tmpfs over DIR holding what DIR held: directories and other files bind-mounted
// from the original (recursively, so the mounts below them come along), symlinks copied.
// SKIP, if not empty, names an entry to leave out; COPY false leaves the tmpfs empty (a
// probe). Returns an fd of the new DIR.
int rebuild(const char* dir, const char* skip, bool copy, Failure& failure) {
  int old = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (old < 0) return fail(failure, std::string("open ") + dir), -1;
  struct stat dir_stat {};
  fstat(old, &dir_stat);
  char options[32];  // tmpfs reads the mode in octal
  std::snprintf(options, sizeof options, "size=64k,mode=%o", dir_stat.st_mode & 07777);
  if (mount("softverbs", dir, "tmpfs", MS_NOSUID | MS_NOEXEC, options) != 0) {
    close(old);
    return fail(failure, std::string("mount tmpfs on ") + dir), -1;
  }
  int fresh = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* entries = fdopendir(dup(old));
  if (fresh < 0 || !entries || fchdir(old) != 0) {
    fail(failure, std::string("open ") + dir);
    if (entries) closedir(entries);
    if (fresh >= 0) close(fresh);
    close(old);
    return -1;
  }
  bool ok = true;
  while (dirent* entry = copy ? readdir(entries) : nullptr) {
    const char* name = entry->d_name;
    if (!std::strcmp(name, ".") || !std::strcmp(name, "..") || !std::strcmp(name, skip)) continue;
    struct stat st {};
    if (fstatat(old, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    std::string target = std::string(dir) + "/" + name;
    if (S_ISLNK(st.st_mode)) {
      char link[4096];
      ssize_t n = readlinkat(old, name, link, sizeof link - 1);
      if (n < 0) continue;
      link[n] = '\0';
      ok = symlinkat(link, fresh, name) == 0 || fail(failure, "symlink " + target);
    } else {
      if (S_ISDIR(st.st_mode)) {
        ok = mkdirat(fresh, name, st.st_mode & 07777) == 0;
      } else {
        int fd = openat(fresh, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
        ok = fd >= 0 && close(fd) == 0;
      }
      // The source is relative to our working directory, the original DIR under the tmpfs.
      ok = (ok && mount(name, target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) == 0) ||
           fail(failure, "bind-mount " + target);
    }
    if (!ok) break;
  }
  closedir(entries);
  close(old);
  if (!ok) {
    // Half a /dev is worse than none: take the tmpfs away again.
    close(fresh);
    umount2(dir, MNT_DETACH);
    return -1;
  }
  return fresh;
}

// Gives this process a private /dev with infiniband/DEV_NAME in it. USER_NS: also a user
// namespace (we are not root); the caller's ids are mapped back before returning. PROBE:
// every step, but /dev is left empty apart from the node (it is only a test).
bool make_dev_node(const char* dev_name, bool user_ns, bool probe, Failure& failure) {
  unsigned uid = geteuid(), gid = getegid();
  if (user_ns) {
    if (!enter_user_namespace(0, uid, 0, gid, failure)) return false;
    if (unshare(CLONE_NEWNS) != 0) return fail(failure, "unshare(CLONE_NEWNS)");
  } else if (unshare(CLONE_NEWNS) != 0) {
    return fail(failure, "unshare(CLONE_NEWNS)");
  }
  // Our mounts must not propagate back to the host's mount namespace.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return fail(failure, "make / private");

  // rebuild() works from inside the original directory: come back here afterwards.
  int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (cwd < 0) return fail(failure, "open the working directory");
  struct stat st {};
  bool have_ib_dir = stat(kIbDir, &st) == 0 && S_ISDIR(st.st_mode);
  // Rebuild the smallest directory that lets us add the node: /dev/infiniband if the host has
  // one (real RDMA devices stay visible), else /dev.
  int dir = have_ib_dir ? rebuild(kIbDir, dev_name, !probe, failure)
                        : rebuild(kDevDir, "", !probe, failure);
  bool ok = dir >= 0;
  if (ok && !have_ib_dir) {
    int ib = -1;
    ok = (mkdirat(dir, "infiniband", 0755) == 0 &&
          (ib = openat(dir, "infiniband", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) ||
         fail(failure, std::string("mkdir ") + kIbDir);
    close(dir);
    dir = ib;
  }
  // Mode 0666 whatever the umask: UCX checks access(R_OK | W_OK).
  ok = ok && ((mknodat(dir, dev_name, S_IFCHR | 0666, makedev(0, 0)) == 0 &&
               fchmodat(dir, dev_name, 0666, 0) == 0) ||
              fail(failure, std::string("mknod ") + kIbDir + "/" + dev_name));
  if (dir >= 0) close(dir);
  if (fchdir(cwd) != 0 && ok) ok = fail(failure, "chdir back");
  close(cwd);
  if (!ok) return false;
  return !user_ns || enter_user_namespace(uid, 0, gid, 0, failure);
}

// Tries make_dev_node in a child process, so that a failure part-way (a user namespace made,
// then no mount allowed) leaves this process as it was. Fills FAILURE from the child's report.
bool probe(const char* dev_name, bool user_ns, Failure& failure) {
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return fail(failure, "pipe");
  pid_t child = fork();
  if (child < 0) {
    close(report[0]);
    close(report[1]);
    return fail(failure, "fork");
  }
  if (child == 0) {
    close(report[0]);
    Failure inner;
    if (make_dev_node(dev_name, user_ns, true, inner)) _exit(0);
    std::string text = inner.what + ": " + std::strerror(inner.error);
    (void)!write(report[1], text.data(), text.size());
    _exit(1);
  }
  close(report[1]);
  char text[512];
  ssize_t n = read(report[0], text, sizeof text - 1);
  close(report[0]);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  failure.error = 0;
  failure.what = n > 0 ? std::string(text, static_cast<size_t>(n)) : "the namespace probe failed";
  return false;
}

bool node_usable(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode) && access(path.c_str(), R_OK | W_OK) == 0;
}

[[noreturn]] void run(char** argv) {
  execvp(argv[0], argv);
  int error = errno;
  std::fprintf(stderr, "softverbs: %s: %s\n", argv[0], std::strerror(error));
  _exit(error == ENOENT ? 127 : 126);
}

bool valid_name(const char* name) {
  size_t length = std::strlen(name);
  return length > 0 && length < 64 && !std::strchr(name, '/') && std::strcmp(name, ".") &&
         std::strcmp(name, "..");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || std::strcmp(argv[2], "--") != 0 || !valid_name(argv[1])) {
    std::fprintf(stderr, "usage: softverbs-dev-node DEV_NAME -- CMD [ARGS...]\n");
    return 2;
  }
  const char* dev_name = argv[1];
  char** command = argv + 3;
  if (node_usable(std::string(kIbDir) + "/" + dev_name)) run(command);

  // Root: a mount namespace alone. Otherwise (or if root may not have one, as in a container
  // without CAP_SYS_ADMIN that allows user namespaces) a user namespace with it.
  Failure failure, first;  // the first failure says most (root: no CAP_SYS_ADMIN)
  bool root = geteuid() == 0;
  for (bool user_ns : {false, true}) {
    if (!user_ns && !root) continue;
    if (!probe(dev_name, user_ns, failure)) {
      if (first.what.empty()) first = failure;
      continue;
    }
    if (make_dev_node(dev_name, user_ns, false, failure)) run(command);
    // The probe passed, so this is unexpected; in a half-made user namespace our uid is not
    // ours any more, and the program must not run like that.
    std::fprintf(stderr, "softverbs: making /dev/infiniband/%s failed: %s: %s (--no-dev-node skips it)\n",
                 dev_name, failure.what.c_str(), std::strerror(failure.error));
    if (user_ns) return 126;
    run(command);
  }
  std::string hint;
  if (root)
    hint = std::string("; for everybody: mkdir -p ") + kIbDir + " && mknod -m 666 " + kIbDir + "/" +
           dev_name + " c 0 0";
  std::fprintf(stderr,
               "softverbs: no private /dev here (%s), so UCX will not see %s%s "
               "(--no-dev-node hides this)\n",
               first.what.c_str(), dev_name, hint.c_str());
  run(command);
}
