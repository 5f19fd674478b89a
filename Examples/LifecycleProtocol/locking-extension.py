#!/usr/bin/env python3
"""The same extension, badly behaved: it keeps a flock on its journal while it waits for the
next push. When the system suspends it, Apple's rule (clause a) kills it: 0xDEAD10CC."""
import fcntl, json, os, socket

channel = socket.socket(fileno=int(os.environ["BATON_LIFECYCLE_FD"]))
reader = channel.makefile("r")
journal = open(os.path.join(os.environ["BATON_CONTAINER"], "journal.txt"), "a")
fcntl.flock(journal, fcntl.LOCK_EX)

def report(kind, **fields):
    channel.sendall((json.dumps({"report": kind, **fields}) + "\n").encode())

report("ready")
for line in reader:
    event = json.loads(line)
    if event["event"] == "push":
        journal.write(f"{event['id']}\n")
        journal.flush()
        report("shown", id=event["id"])
        report("done", id=event["id"])
    elif event["event"] == "will-suspend":
        report("released-locks", detail="but keeps its flock")
    elif event["event"] == "will-terminate":
        break
