// Behaviour of the device-free exports of our libibverbs.so.1 (src/abi/util_exports.cpp,
// private_exports.cpp, compat_exports.cpp). Where rdma-core's library is installed, its answers
// are the expectation: it is loaded with dlmopen() into a namespace of its own, so both
// libibverbs.so.1 can live in this process.

#include <gtest/gtest.h>

#include "abi/util_exports.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

// The private (IBVERBS_PRIVATE_34) exports under test, with the argument types simplified.
extern "C" {
extern bool verbs_allow_disassociate_destroy;
void verbs_register_driver_34(const void *ops);
void verbs_init_cq(struct ibv_cq *cq, struct ibv_context *context,
                   struct ibv_comp_channel *channel, void *cq_context);
void __verbs_log(void *ctx, uint32_t level, const char *fmt, ...);
int execute_ioctl(struct ibv_context *context, void *cmd);
struct ibv_context *verbs_open_device(struct ibv_device *device, void *private_data);
int ibv_cmd_alloc_pd(struct ibv_context *, struct ibv_pd *, void *, size_t, void *, size_t);
int ibv_cmd_poll_cq(struct ibv_cq *cq, int ne, struct ibv_wc *wc);
int ibv_cmd_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
}

namespace {

// rdma-core's library in a namespace of its own, or nullptr when it is not installed.
void *real_library() {
    static void *handle = [] {
        void *h = dlmopen(LM_ID_NEWLM, SOFTVERBS_REAL_LIBIBVERBS, RTLD_NOW | RTLD_LOCAL);
        return h;
    }();
    return handle;
}

template <typename Fn>
Fn real_fn(const char *name) {
    void *h = real_library();
    return h ? reinterpret_cast<Fn>(dlsym(h, name)) : nullptr;
}

#define REQUIRE_REAL(fn)                                                                        \
    if (!(fn))                                                                                  \
    GTEST_SKIP() << "rdma-core's libibverbs (" SOFTVERBS_REAL_LIBIBVERBS ") not loadable"

template <typename T>
void fill_random(T *obj, std::mt19937 &rng) {
    auto *bytes = reinterpret_cast<unsigned char *>(obj);
    for (size_t i = 0; i < sizeof(T); ++i)
        bytes[i] = static_cast<unsigned char>(rng());
}

std::string make_temp_dir() {
    char tmpl[] = "/tmp/softverbs-abi-XXXXXX";
    const char *dir = mkdtemp(tmpl);
    return dir ? dir : "";
}

// --- strings -------------------------------------------------------------------------------------

TEST(Strings, KnownValues) {
    EXPECT_STREQ(ibv_wc_status_str(IBV_WC_SUCCESS), "success");
    EXPECT_STREQ(ibv_wc_status_str(IBV_WC_LOC_LEN_ERR), "local length error");
    EXPECT_STREQ(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error");
    EXPECT_STREQ(ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
    EXPECT_STREQ(ibv_wc_status_str(static_cast<ibv_wc_status>(999)), "unknown");
    EXPECT_STREQ(ibv_port_state_str(IBV_PORT_ACTIVE), "active");
    EXPECT_STREQ(ibv_port_state_str(IBV_PORT_NOP), "no state change (NOP)");
    EXPECT_STREQ(ibv_port_state_str(static_cast<ibv_port_state>(6)), "unknown");
    EXPECT_STREQ(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter");
    EXPECT_STREQ(ibv_node_type_str(IBV_NODE_UNKNOWN), "unknown");
    EXPECT_STREQ(ibv_node_type_str(static_cast<ibv_node_type>(0)), "unknown");
    EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_PORT_ACTIVE), "port active");
    EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_WQ_FATAL), "WQ fatal");
    EXPECT_STREQ(ibv_event_type_str(static_cast<ibv_event_type>(-1)), "unknown");
}

TEST(Strings, MatchRealLibrary) {
    auto wc = real_fn<const char *(*)(int)>("ibv_wc_status_str");
    auto port = real_fn<const char *(*)(int)>("ibv_port_state_str");
    auto node = real_fn<const char *(*)(int)>("ibv_node_type_str");
    auto event = real_fn<const char *(*)(int)>("ibv_event_type_str");
    REQUIRE_REAL(wc && port && node && event);
    for (int v = -3; v < 64; ++v) {
        EXPECT_STREQ(ibv_wc_status_str(static_cast<ibv_wc_status>(v)), wc(v)) << v;
        EXPECT_STREQ(ibv_port_state_str(static_cast<ibv_port_state>(v)), port(v)) << v;
        EXPECT_STREQ(ibv_node_type_str(static_cast<ibv_node_type>(v)), node(v)) << v;
        EXPECT_STREQ(ibv_event_type_str(static_cast<ibv_event_type>(v)), event(v)) << v;
    }
}

// --- rates ---------------------------------------------------------------------------------------

TEST(Rates, KnownValues) {
    EXPECT_EQ(ibv_rate_to_mult(IBV_RATE_10_GBPS), 4);
    EXPECT_EQ(ibv_rate_to_mult(IBV_RATE_100_GBPS), -1);
    EXPECT_EQ(mult_to_ibv_rate(48), IBV_RATE_120_GBPS);
    EXPECT_EQ(mult_to_ibv_rate(3), IBV_RATE_MAX);
    EXPECT_EQ(ibv_rate_to_mbps(IBV_RATE_100_GBPS), 103125);
    EXPECT_EQ(ibv_rate_to_mbps(IBV_RATE_MAX), -1);
    EXPECT_EQ(mbps_to_ibv_rate(25781), IBV_RATE_25_GBPS);
    EXPECT_EQ(mbps_to_ibv_rate(25000), IBV_RATE_MAX);
}

TEST(Rates, MatchRealLibrary) {
    auto to_mult = real_fn<int (*)(int)>("ibv_rate_to_mult");
    auto from_mult = real_fn<int (*)(int)>("mult_to_ibv_rate");
    auto to_mbps = real_fn<int (*)(int)>("ibv_rate_to_mbps");
    auto from_mbps = real_fn<int (*)(int)>("mbps_to_ibv_rate");
    REQUIRE_REAL(to_mult && from_mult && to_mbps && from_mbps);
    for (int r = -2; r < 40; ++r) {
        auto rate = static_cast<ibv_rate>(r);
        EXPECT_EQ(ibv_rate_to_mult(rate), to_mult(r)) << r;
        EXPECT_EQ(ibv_rate_to_mbps(rate), to_mbps(r)) << r;
        int mbps = to_mbps(r);
        EXPECT_EQ(static_cast<int>(mbps_to_ibv_rate(mbps)), from_mbps(mbps)) << mbps;
    }
    for (int m = -2; m < 600; ++m)
        EXPECT_EQ(static_cast<int>(mult_to_ibv_rate(m)), from_mult(m)) << m;
    for (int mbps : {0, 1, 2499, 14000, 100000, 400000, 1275001})
        EXPECT_EQ(static_cast<int>(mbps_to_ibv_rate(mbps)), from_mbps(mbps)) << mbps;
}

// --- kernel ABI copies ---------------------------------------------------------------------------

TEST(KernCopies, MatchRealLibrary) {
    auto ah = real_fn<void (*)(ibv_ah_attr *, ib_uverbs_ah_attr *)>("ibv_copy_ah_attr_from_kern");
    auto qp = real_fn<void (*)(ibv_qp_attr *, ib_uverbs_qp_attr *)>("ibv_copy_qp_attr_from_kern");
    auto from = real_fn<void (*)(ibv_sa_path_rec *, ib_user_path_rec *)>(
        "ibv_copy_path_rec_from_kern");
    auto to = real_fn<void (*)(ib_user_path_rec *, ibv_sa_path_rec *)>(
        "ibv_copy_path_rec_to_kern");
    REQUIRE_REAL(ah && qp && from && to);

    std::mt19937 rng(1234);
    for (int round = 0; round < 50; ++round) {
        ib_uverbs_ah_attr kah;
        fill_random(&kah, rng);
        ibv_ah_attr mine{}, theirs{};
        ibv_copy_ah_attr_from_kern(&mine, &kah);
        ah(&theirs, &kah);
        EXPECT_EQ(memcmp(&mine, &theirs, sizeof mine), 0);

        ib_uverbs_qp_attr kqp;
        fill_random(&kqp, rng);
        ibv_qp_attr qmine{}, qtheirs{};
        ibv_copy_qp_attr_from_kern(&qmine, &kqp);
        qp(&qtheirs, &kqp);
        EXPECT_EQ(memcmp(&qmine, &qtheirs, sizeof qmine), 0);

        ib_user_path_rec kpath;
        fill_random(&kpath, rng);
        ibv_sa_path_rec pmine{}, ptheirs{};
        ibv_copy_path_rec_from_kern(&pmine, &kpath);
        from(&ptheirs, &kpath);
        EXPECT_EQ(memcmp(&pmine, &ptheirs, sizeof pmine), 0);

        ibv_sa_path_rec upath;
        fill_random(&upath, rng);
        ib_user_path_rec kmine{}, ktheirs{};
        ibv_copy_path_rec_to_kern(&kmine, &upath);
        to(&ktheirs, &upath);
        EXPECT_EQ(memcmp(&kmine, &ktheirs, sizeof kmine), 0);
    }
}

TEST(KernCopies, QpAttrFields) {
    ib_uverbs_qp_attr k{};
    k.qkey = 0x11111111;
    k.dest_qp_num = 0xabcdef;
    k.path_mtu = IBV_MTU_1024;
    k.ah_attr.dlid = 7;
    k.ah_attr.grh.dgid[15] = 9;
    k.alt_timeout = 14;
    ibv_qp_attr a{};
    ibv_copy_qp_attr_from_kern(&a, &k);
    EXPECT_EQ(a.qkey, 0x11111111u);
    EXPECT_EQ(a.dest_qp_num, 0xabcdefu);
    EXPECT_EQ(a.path_mtu, IBV_MTU_1024);
    EXPECT_EQ(a.ah_attr.dlid, 7);
    EXPECT_EQ(a.ah_attr.grh.dgid.raw[15], 9);
    EXPECT_EQ(a.alt_timeout, 14);
}

// --- sysfs ---------------------------------------------------------------------------------------

TEST(Sysfs, PathFollowsEnvironment) {
    // ctest sets SYSFS_PATH=/softverbs-sysfs-test//; trailing slashes are dropped.
    const char *env = getenv("SYSFS_PATH");
    if (!env) {
        EXPECT_STREQ(ibv_get_sysfs_path(), "/sys");
    } else if (std::string(env) == "/softverbs-sysfs-test//") {
        EXPECT_STREQ(ibv_get_sysfs_path(), "/softverbs-sysfs-test");
    }
    EXPECT_EQ(ibv_get_sysfs_path(), ibv_get_sysfs_path());
}

TEST(Sysfs, ReadFile) {
    std::string dir = make_temp_dir();
    ASSERT_FALSE(dir.empty());
    std::ofstream(dir + "/board_id") << "SOFT_0001\n";
    std::ofstream(dir + "/raw") << "abc";
    std::ofstream(dir + "/empty");

    char buf[64];
    memset(buf, 'x', sizeof buf);
    EXPECT_EQ(ibv_read_sysfs_file(dir.c_str(), "board_id", buf, sizeof buf), 9);
    EXPECT_STREQ(buf, "SOFT_0001");
    EXPECT_EQ(ibv_read_sysfs_file(dir.c_str(), "raw", buf, sizeof buf), 3);
    EXPECT_STREQ(buf, "abc");
    EXPECT_EQ(ibv_read_sysfs_file(dir.c_str(), "empty", buf, sizeof buf), 0);
    // No room for the terminator: fail rather than hand back an unterminated string.
    EXPECT_EQ(ibv_read_sysfs_file(dir.c_str(), "raw", buf, 3), -1);
    // A newline in the last byte is replaced, so that fits.
    EXPECT_EQ(ibv_read_sysfs_file(dir.c_str(), "board_id", buf, 10), 9);
    EXPECT_EQ(ibv_read_sysfs_file(dir.c_str(), "missing", buf, sizeof buf), -1);
    // ibv_devinfo asks for board_id under a device path that does not exist.
    EXPECT_EQ(ibv_read_sysfs_file("/nonexistent/softverbs/device", "board_id", buf, sizeof buf),
              -1);

    auto real = real_fn<int (*)(const char *, const char *, char *, size_t)>(
        "ibv_read_sysfs_file");
    if (real) {
        char theirs[64];
        for (const char *file : {"board_id", "raw", "empty", "missing"}) {
            for (size_t size : {size_t{3}, size_t{4}, size_t{10}, sizeof buf}) {
                memset(buf, 'x', sizeof buf);
                memset(theirs, 'x', sizeof theirs);
                EXPECT_EQ(ibv_read_sysfs_file(dir.c_str(), file, buf, size),
                          real(dir.c_str(), file, theirs, size))
                    << file << " " << size;
                EXPECT_EQ(memcmp(buf, theirs, sizeof buf), 0) << file << " " << size;
            }
        }
    }

    for (const char *file : {"board_id", "raw", "empty"})
        unlink((dir + "/" + file).c_str());
    rmdir(dir.c_str());
}

// --- IBVERBS_PRIVATE_34 --------------------------------------------------------------------------

TEST(Private, DataObjectAndRegistration) {
    EXPECT_FALSE(verbs_allow_disassociate_destroy);
    EXPECT_EQ(sizeof verbs_allow_disassociate_destroy, 1u);
    verbs_register_driver_34(nullptr);  // libmlx5/libefa constructors: accepted, ignored
}

TEST(Private, InitCq) {
    ibv_context ctx{};
    pthread_mutex_init(&ctx.mutex, nullptr);
    ibv_comp_channel channel{};
    channel.refcnt = 2;
    ibv_cq cq;
    memset(&cq, 0xa5, sizeof cq);
    int tag = 0;
    verbs_init_cq(&cq, &ctx, &channel, &tag);
    EXPECT_EQ(cq.context, &ctx);
    EXPECT_EQ(cq.channel, &channel);
    EXPECT_EQ(cq.cq_context, &tag);
    EXPECT_EQ(cq.comp_events_completed, 0u);
    EXPECT_EQ(cq.async_events_completed, 0u);
    EXPECT_EQ(channel.refcnt, 3);
    EXPECT_EQ(pthread_mutex_trylock(&cq.mutex), 0);
    pthread_mutex_unlock(&cq.mutex);
    pthread_mutex_destroy(&cq.mutex);
    pthread_cond_destroy(&cq.cond);

    ibv_cq cq2;
    verbs_init_cq(&cq2, &ctx, nullptr, nullptr);
    EXPECT_EQ(cq2.channel, nullptr);
    EXPECT_EQ(channel.refcnt, 3);
    pthread_mutex_destroy(&cq2.mutex);
    pthread_cond_destroy(&cq2.cond);
    pthread_mutex_destroy(&ctx.mutex);
}

TEST(Private, CommandHelpersFailCleanly) {
    EXPECT_EQ(execute_ioctl(nullptr, nullptr), EOPNOTSUPP);
    EXPECT_EQ(ibv_cmd_alloc_pd(nullptr, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
    errno = 0;
    EXPECT_EQ(verbs_open_device(nullptr, nullptr), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    errno = 0;
    EXPECT_EQ(ibv_cmd_poll_cq(nullptr, 4, nullptr), -1);
    EXPECT_EQ(errno, EOPNOTSUPP);
    ibv_send_wr wr{};
    ibv_send_wr *bad = nullptr;
    EXPECT_EQ(ibv_cmd_post_send(nullptr, &wr, &bad), EOPNOTSUPP);
    EXPECT_EQ(bad, &wr);
}

TEST(Private, LogIsSilentByDefault) {
    // ctest runs this with VERBS_LOG_LEVEL empty: nothing may reach stderr, errno is kept.
    testing::internal::CaptureStderr();
    errno = ENOENT;
    __verbs_log(nullptr, 1, "softverbs %s\n", "should not print");
    EXPECT_EQ(errno, ENOENT);
    std::string printed = testing::internal::GetCapturedStderr();
    const char *level = getenv("VERBS_LOG_LEVEL");
    if (!level || atoi(level) <= 0) {
        EXPECT_EQ(printed, "");
    }
}

// --- compat symbols ------------------------------------------------------------------------------

TEST(Compat, VersionedAliasesFailCleanly) {
    void *self = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(self, nullptr);

    auto alloc_pd = reinterpret_cast<void *(*)(void *)>(dlvsym(self, "ibv_alloc_pd", "IBVERBS_1.0"));
    ASSERT_NE(alloc_pd, nullptr);
    errno = 0;
    EXPECT_EQ(alloc_pd(nullptr), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);

    auto get_list = reinterpret_cast<void *(*)(int *)>(
        dlvsym(self, "ibv_get_device_list", "IBVERBS_1.0"));
    ASSERT_NE(get_list, nullptr);
    int num = 5;
    EXPECT_EQ(get_list(&num), nullptr);
    EXPECT_EQ(num, 0);

    auto dealloc_pd = reinterpret_cast<int (*)(void *)>(
        dlvsym(self, "ibv_dealloc_pd", "IBVERBS_1.0"));
    ASSERT_NE(dealloc_pd, nullptr);
    EXPECT_EQ(dealloc_pd(nullptr), EOPNOTSUPP);

    auto query_gid = reinterpret_cast<int (*)(void *, uint8_t, int, void *)>(
        dlvsym(self, "ibv_query_gid", "IBVERBS_1.0"));
    ASSERT_NE(query_gid, nullptr);
    EXPECT_EQ(query_gid(nullptr, 1, 0, nullptr), -1);

    auto reg_driver = reinterpret_cast<void (*)(const char *, void *)>(
        dlvsym(self, "ibv_register_driver", "IBVERBS_1.1"));
    ASSERT_NE(reg_driver, nullptr);
    reg_driver("old", nullptr);

    // The implementation names behind the aliases stay local.
    EXPECT_EQ(dlsym(self, "sv_compat_alloc_pd_1_0"), nullptr);
    EXPECT_EQ(dlsym(self, "sv_compat_register_driver_1_1"), nullptr);
    dlclose(self);
}

}  // namespace
