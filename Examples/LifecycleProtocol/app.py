#!/usr/bin/env python3
"""A minimal app in Python: it reports each lifecycle event and holds no lock."""
import json, os, socket

channel = socket.socket(fileno=int(os.environ["BATON_LIFECYCLE_FD"]))

def report(kind, **fields):
    channel.sendall((json.dumps({"report": kind, **fields}) + "\n").encode())

report("ready")
for line in channel.makefile("r"):
    event = json.loads(line)["event"]
    if event == "will-enter-foreground":
        report("connected")
    elif event == "will-suspend":
        report("disconnected")
        report("released-locks")
    elif event == "will-terminate":
        break
