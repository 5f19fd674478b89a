#!/usr/bin/env python3
"""A notification service extension in Python, driven by Baton's lifecycle protocol.

The simulator (`baton simulate`) passes a socket on the descriptor named by
BATON_LIFECYCLE_FD: events arrive on it as JSON lines, reports go back the same way.
This extension writes each push to a journal file in the shared container, without holding
any lock, and reports it shown.
"""
import json, os, socket

channel = socket.socket(fileno=int(os.environ["BATON_LIFECYCLE_FD"]))
reader = channel.makefile("r")

def report(kind, **fields):
    channel.sendall((json.dumps({"report": kind, **fields}) + "\n").encode())

report("ready")
for line in reader:
    event = json.loads(line)
    name = event["event"]
    if name == "push":
        with open(os.path.join(os.environ["BATON_CONTAINER"], "journal.txt"), "a") as journal:
            journal.write(f"{event['id']} {event.get('payload') or ''}\n")
        report("shown", id=event["id"], detail="python extension")
        report("done", id=event["id"])
    elif name == "will-suspend":
        report("released-locks")
    elif name == "will-terminate":
        break
