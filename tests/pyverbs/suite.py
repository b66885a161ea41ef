#!/usr/bin/env python3
"""Runs rdma-core's tests/run_tests.py unchanged, with four additions.

- Known failures: tests listed in a known-failures file still run. When one fails the
  way the file expects, it is reported as skipped ("known failure: REASON"). When
  it fails otherwise, that is a real failure; when it passes, that fails too, so that the
  file's entry gets removed once the bug is fixed.
- A summary after unittest's output: counts, then the id of every failure and error.
- The seed of Python's `random`, which the suite uses for QP capabilities, create flags,
  PSNs and the GID it picks: printed, and settable, so that a run can be repeated.
- An IP address for the rdma_cm tests (127.0.0.1, or --cm-addr ADDR). RDMACMBaseTest takes
  the device's address from its netdev, /sys/class/infiniband/DEV/device/net/, and skips
  without one; a device without a kernel driver has no such entry. See
  give_cm_tests_an_address.
- With --peer-netns NS --peer-state-dir DIR --cm-active-addr ADDR, the passive side of
  every rdma_cm test runs on another host: its forked process enters network namespace NS
  (/run/netns/NS) and takes DIR as its SOFTVERBS_STATE_DIR before it does anything else;
  the active side stays here and binds ADDR, an address of this host. --cm-addr is then
  the other host's address. See put_passive_side_on_peer_host.

Usage: suite.py [--seed N] [--cm-addr ADDR]
                [--peer-netns NS --peer-state-dir DIR --cm-active-addr ADDR]
                [--known-failures FILE]... RUN_TESTS_PY [ARGS...]
A known-failures file holds one test per line, three fields separated by ' | ': the full
test id, a regular expression that its failure ("ExceptionType: message") must match, and
the reason. '#' starts a comment.
Exit status: unittest's (non-zero on any failure or error), or 1 when no test ran.
"""
import ctypes
import os
import random
import re
import runpy
import sys
import unittest

KNOWN_FAILURE = 'known failure: '
DEFAULT_CM_ADDR = '127.0.0.1'


def usage_error(message):
    print(f'suite.py: {message}', file=sys.stderr)
    sys.exit(2)


def read_known_failures(path):
    known = {}
    with open(path, encoding='utf-8') as lines:
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith('#'):
                continue
            fields = [field.strip() for field in line.split(' | ')]
            if len(fields) != 3 or not all(fields):
                usage_error(f'{path}:{number}: want "TEST_ID | MESSAGE REGEX | REASON"')
            try:
                pattern = re.compile(fields[1])
            except re.error as bad:
                usage_error(f'{path}:{number}: {bad}')
            known[fields[0]] = (pattern, fields[2])
    return known


def parse_args(argv):
    known = {}
    seed = None
    cm_addr = DEFAULT_CM_ADDR
    peer = {}
    peer_options = ('--peer-netns', '--peer-state-dir', '--cm-active-addr')
    while argv and argv[0] in ('--known-failures', '--seed', '--cm-addr') + peer_options:
        if len(argv) < 2:
            usage_error(f'{argv[0]} needs a value')
        if argv[0] in peer_options:
            peer[argv[0][2:]] = argv[1]
        elif argv[0] == '--seed':
            if not argv[1].isdigit():
                usage_error(f'--seed wants a number, not "{argv[1]}"')
            seed = int(argv[1])
        elif argv[0] == '--cm-addr':
            cm_addr = argv[1]
        else:
            known.update(read_known_failures(argv[1]))
        argv = argv[2:]
    if peer and len(peer) != len(peer_options):
        usage_error(' '.join(peer_options) + ' go together')
    if not argv:
        usage_error('usage: suite.py [--seed N] [--cm-addr ADDR] [--peer-netns NS '
                    '--peer-state-dir DIR] [--known-failures FILE]... RUN_TESTS_PY [ARGS...]')
    return seed, cm_addr, peer, known, argv[0], argv[1:]


def test_cases(suite):
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from test_cases(test)
        else:
            yield test


def expect_failure(test, pattern, reason):
    """Wraps the test method: the expected failure becomes a skip, a pass a failure."""
    method = getattr(test, test._testMethodName)

    def known_failure():
        try:
            method()
        except unittest.SkipTest:
            raise
        except Exception as failure:
            if not pattern.search(f'{type(failure).__name__}: {failure}'):
                raise
            raise unittest.SkipTest(KNOWN_FAILURE + reason) from failure
        raise AssertionError('listed as a known failure but passed: remove it from the '
                             'known-failures file')

    setattr(test, test._testMethodName, known_failure)


def give_cm_tests_an_address(cm_addr):
    """Lets the rdma_cm tests find an IP address for a device that has no netdev.

    rdma-core's RDMATestCase._get_ip_mac (tests/base.py) looks for the device's netdev in
    /sys/class/infiniband/DEV/device/net/ and reads its first address with `ip -j addr
    show`. Without that directory it records no address, and RDMACMBaseTest.setUp skips
    every rdma_cm test ("Device softverbs0 doesn't have net interface"). Only a device
    that a kernel driver registered has the entry, so softverbs never will. Here, and only
    for RDMACMBaseTest and its subclasses, a device without the entry gets cm_addr (by
    default 127.0.0.1, which softverbs0 lists among its GIDs); a device with the entry goes through
    the original code. The MAC stays unknown (None), as the original leaves it when the
    netdev has no address; only mlx5 tests read it. The files on disk stay as shipped: this
    patches the loaded class, before any test runs, and the forked passive and active
    processes of each test inherit it.
    """
    base = sys.modules.get('tests.base')
    if base is None:
        return  # the suite's modules were not loaded (--list-tests, or an import error)
    original = getattr(getattr(base, 'RDMATestCase', None), '_get_ip_mac', None)
    if not hasattr(base, 'RDMACMBaseTest') or original is None:
        print('suite.py: tests/base.py has no RDMACMBaseTest or RDMATestCase._get_ip_mac; '
              'the rdma_cm tests get no address and skip without a netdev', file=sys.stderr)
        return

    def _get_ip_mac(self, dev, port, idx):
        if os.path.exists(f'/sys/class/infiniband/{dev}/device/net/'):
            return original(self, dev, port, idx)
        self.args.append([dev, port, idx, cm_addr, None])
        return None

    base.RDMACMBaseTest._get_ip_mac = _get_ip_mac


def enter_host(netns, state_dir):
    """Makes this (freshly forked) process one of another host's: its network namespace
    and its softverbs state directory, as tests/conformance/common.c's peers do."""
    clone_newnet = 0x40000000
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f'/run/netns/{netns}', os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, clone_newnet) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f'setns({netns}): {os.strerror(err)}')
    finally:
        os.close(fd)
    os.environ['SOFTVERBS_STATE_DIR'] = state_dir


def use_own_source_address(active_addr):
    """In the active process: rdma-core's CMResources (tests/base_rdmacm.py) resolve with
    AddrInfo(src=ADDR, dst=ADDR); an AddrInfo whose source equals its destination gets
    active_addr as its source instead."""
    module = sys.modules.get('tests.base_rdmacm')
    original = getattr(module, 'AddrInfo', None)
    if original is None:
        usage_error('tests/base_rdmacm.py has no AddrInfo: cannot give the active side its address')

    def addr_info(*args, **kwargs):
        if kwargs.get('dst') is not None and kwargs.get('src') == kwargs.get('dst'):
            kwargs['src'] = active_addr
        return original(*args, **kwargs)

    module.AddrInfo = addr_info


def put_passive_side_on_peer_host(netns, state_dir, active_addr):
    """Runs the passive side of each rdma_cm test on the other host (--peer-netns).

    RDMACMBaseTest.two_nodes_rdmacm_traffic forks a passive and an active process, each
    running test_flow(passive=True/False); their barrier and queue are shared memory and
    pipes, which work across network namespaces. The passive one enters the other host
    first, then binds and listens on its address (--cm-addr); the active one, here,
    resolves that address as another host's and connects over RoCE v2. rdma-core's
    CMResources give the active side the same address as source and destination (one
    host); here its source becomes active_addr, this host's. The multicast tests join on
    both hosts and send across (IP multicast, docs/decisions/0008)."""
    base = sys.modules.get('tests.base')
    original = getattr(getattr(base, 'RDMACMBaseTest', None), 'two_nodes_rdmacm_traffic', None)
    if original is None:
        usage_error('tests/base.py has no RDMACMBaseTest.two_nodes_rdmacm_traffic: '
                    '--peer-netns cannot place the passive side')

    def two_nodes_rdmacm_traffic(self, connection_resources, test_flow, *args, **kwargs):
        def flow(*flow_args, passive=None, **flow_kwargs):
            if passive:
                enter_host(netns, state_dir)
            else:
                use_own_source_address(active_addr)
            return test_flow(*flow_args, passive=passive, **flow_kwargs)

        flow.__name__ = getattr(test_flow, '__name__', 'flow')
        return original(self, connection_resources, flow, *args, **kwargs)

    base.RDMACMBaseTest.two_nodes_rdmacm_traffic = two_nodes_rdmacm_traffic


def print_summary(result):
    known = sum(1 for _, why in result.skipped if why.startswith(KNOWN_FAILURE))
    skipped = len(result.skipped) - known
    broken = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    passed = result.testsRun - broken - len(result.skipped) - len(result.expectedFailures)
    extra = ''
    if result.expectedFailures:
        extra += f', {len(result.expectedFailures)} expected failures'
    if result.unexpectedSuccesses:
        extra += f', {len(result.unexpectedSuccesses)} unexpected successes'
    print(f'\npyverbs suite: ran {result.testsRun}: {passed} passed, '
          f'{len(result.failures)} failures, {len(result.errors)} errors, {skipped} skipped, '
          f'{known} known failures{extra}')
    for kind, entries in (('FAIL', result.failures), ('ERROR', result.errors)):
        for test, _ in entries:
            print(f'  {kind}: {test.id()}')
    for test in result.unexpectedSuccesses:
        print(f'  UNEXPECTED SUCCESS: {test.id()}')
    # A floor failure on a machine without huge pages should say why at once.
    no_huge = sum(1 for _, why in result.skipped if 'huge pages' in why)
    if no_huge:
        print(f'  {no_huge} skipped for want of huge pages: {huge_pages_note()}')
    # Raw packet QPs need root (CAP_NET_RAW), as on a real NIC; the suite skips them without.
    no_root = sum(1 for _, why in result.skipped if 'by root' in why)
    if no_root:
        print(f'  {no_root} skipped for want of root: raw packet QPs need CAP_NET_RAW')


HUGE_PAGES = '/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages'


def huge_pages_note():
    """What the suite's huge page tests (tests.utils.huge_pages_supported) will find: they
    skip when no 2 MiB page is reserved, which only root can change."""
    try:
        with open(HUGE_PAGES, encoding='utf-8') as count:
            reserved = int(count.read())
    except (OSError, ValueError):
        return 'huge pages: this kernel has no 2 MiB huge pages; 3 tests will skip'
    if reserved == 0:
        return ('huge pages: NONE reserved, so test_odp (2) and test_parent_domain (1) will '
                'skip; as root: echo 8 > /proc/sys/vm/nr_hugepages (.ci/run does it)')
    return f'huge pages: {reserved} of 2 MiB reserved'


def loaded_libibverbs():
    with open('/proc/self/maps', encoding='utf-8') as maps:
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip()
            if os.path.basename(path).startswith('libibverbs.so'):
                return path
    return 'not loaded'


def main():
    seed, cm_addr, peer, known, run_tests, args = parse_args(sys.argv[1:])
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    random.seed(seed)
    import pyverbs.device  # loads libibverbs.so.1, as the suite will
    print(f'pyverbs: {os.path.dirname(pyverbs.device.__file__)}')
    print(f'libibverbs: {loaded_libibverbs()}')
    print(f'random seed: {seed} (repeat this run with --seed {seed})')
    print(f'rdma_cm tests: address {cm_addr} for a device without a netdev')
    print(huge_pages_note(), flush=True)
    if peer:
        print(f'rdma_cm tests: passive side in network namespace {peer["peer-netns"]}, '
              f'SOFTVERBS_STATE_DIR={peer["peer-state-dir"]}; active side from '
              f'{peer["cm-active-addr"]}', flush=True)

    results = []
    original_run = unittest.TextTestRunner.run

    def run(runner, suite):
        # Every test module is imported by now (the suite's tests/__init__.py does it).
        give_cm_tests_an_address(cm_addr)
        if peer:
            put_passive_side_on_peer_host(peer['peer-netns'], peer['peer-state-dir'],
                                          peer['cm-active-addr'])
        for test in test_cases(suite):
            if test.id() in known:
                expect_failure(test, *known[test.id()])
        result = original_run(runner, suite)
        print_summary(result)
        results.append(result)
        return result

    unittest.TextTestRunner.run = run
    # As `python3 tests/run_tests.py ARGS` would: the script's directory first on sys.path
    # (the suite imports args_parser from there), its own name in argv[0].
    sys.path[0] = os.path.dirname(os.path.abspath(run_tests))
    sys.argv = [run_tests] + args
    try:
        runpy.run_path(run_tests, run_name='__main__')
        status = 0
    except SystemExit as exit_request:
        status = exit_request.code
    if status == 0 and results and results[-1].testsRun == 0 and '--list-tests' not in args:
        print('pyverbs suite: no test ran', file=sys.stderr)
        status = 1
    sys.exit(status)


if __name__ == '__main__':
    main()
