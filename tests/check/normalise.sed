# What changes from run to run in a `softverbs check` report: addresses, code offsets, keys,
# QP numbers, the pid and the count of calls.
s/0x[0-9a-f]{8,}/0xPTR/g
s/\+0x[0-9a-f]+/+0xOFF/g
s/(lkey|rkey) 0x[0-9a-f]+/\1 0xKEY/g
s/qpn [0-9]+/qpn N/g
s/pid [0-9]+/pid PID/g
s/[0-9]+ verbs calls checked/N verbs calls checked/g
