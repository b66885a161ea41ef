#!/usr/bin/env python3
"""Which functions of two builds of a library differ in their machine code.

Usage: scripts/compare_functions.py BEFORE.so AFTER.so [REGEX] [--list]

Disassembles both (objdump -d -C) and compares each function's instructions with the
addresses taken out: a jump or call keeps its symbol+offset and loses its absolute address,
a %rip-relative operand loses its displacement (data that moved is not code that changed).
Prints how many functions whose name matches REGEX (default: the data path, post_send /
post_recv / poll_cq and the engine under them) are identical, then the whole library's
count, and with --list every function that differs. Load-independent evidence that a
change leaves the data path as it was (docs/stat.md, "Cost when no one looks").
"""
import re
import subprocess
import sys

DATA_PATH = (r"post_send|post_recv|poll_cq|post_srq_recv|cq_push|run_send_queue|take_inbound|"
             r"req_notify|get_cq_event|ack_cq_events|respond|complete|requester|responder|"
             r"completer|drain|window|wr_")


def functions(path):
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", path],
                          capture_output=True, text=True, check=True).stdout
    code, name = {}, None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            name = head.group(1)
            code[name] = []
            continue
        insn = re.match(r"^ *[0-9a-f]+:\t(.*)$", line)
        if insn and name:
            i = re.sub(r"\b[0-9a-f]+ <([^>]*)>", r"<\1>", insn.group(1))
            i = re.sub(r"#.*$", "", i)
            i = re.sub(r"-?0x[0-9a-f]+\(%rip\)", "X(%rip)", i)
            code[name].append(i.strip())
    return code


def main():
    args = [a for a in sys.argv[1:] if a != "--list"]
    if len(args) < 2:
        sys.exit(__doc__)
    before, after = functions(args[0]), functions(args[1])
    pattern = re.compile(args[2] if len(args) > 2 else DATA_PATH)
    matching = sorted(n for n in before if pattern.search(n))
    differ = [n for n in matching if n in after and before[n] != after[n]]
    gone = [n for n in matching if n not in after]
    print(f"functions matching: {len(matching)}, identical: {len(matching) - len(differ) - len(gone)}, "
          f"different: {len(differ)}, gone: {len(gone)}")
    for n in differ + gone:
        print("  differs:", n)
    changed = [n for n in before if n in after and before[n] != after[n] and "@plt" not in n]
    print(f"whole library: {len(before)} functions before, {len(changed)} differ (PLT stubs left "
          f"out), {sum(1 for n in after if n not in before)} new")
    if "--list" in sys.argv:
        for n in changed:
            print("   ", n)


if __name__ == "__main__":
    main()
