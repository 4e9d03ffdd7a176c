#!/usr/bin/env python3
"""Prints a TCP port free now and below the kernel's ephemeral range, for MASTER_PORT.

A port from bind(port 0) is ephemeral: between its release and the store's bind, any outgoing
connection on the host may take it ("Address already in use"). A port below that range is only
taken by someone who asks for it by number. The same policy as sucl's unused_loopback_port().
"""
import random
import socket
import sys

if "--help" in sys.argv or "-h" in sys.argv:
    print(__doc__.strip())
    sys.exit(0)
try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        high = int(f.read().split()[0])
except (OSError, ValueError, IndexError):
    high = 32768
high = max(high, 10100)
for port in random.sample(range(10000, high), min(2048, high - 10000)):
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            continue
    print(port)
    sys.exit(0)
sys.exit("free_port.py: no free port below the ephemeral range")
