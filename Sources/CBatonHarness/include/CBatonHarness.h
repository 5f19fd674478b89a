// C helpers for Baton's own test and benchmark processes (not part of the library).
#ifndef C_BATON_HARNESS_H
#define C_BATON_HARNESS_H

/// Exits the process (status 137) as soon as its parent exits: a thread waits on a pidfd of the
/// parent (Linux). For test and benchmark children, so that none outlives its runner. Returns 0,
/// or -1 where the parent cannot be watched (Apple platforms: the harness runs on Linux).
int baton_exit_with_parent(void);

#endif
