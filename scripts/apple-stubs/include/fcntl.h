// Apple's additions to <fcntl.h> (<sys/fcntl.h>), layered over glibc's for type-checking
// Baton's Apple code on Linux. Source: apple-oss-distributions/xnu bsd/sys/fcntl.h
// (commit 1031c584); values kept. Note: the O_* flags Baton also uses keep glibc's values here
// (Apple's differ, e.g. O_CLOEXEC 0x01000000); only types are checked, not values.
#ifndef BATON_STUB_APPLE_FCNTL_UNAVAILABLE
#define BATON_STUB_APPLE_FCNTL_UNAVAILABLE
#include <sys/types.h>
// Linux-only, declared before glibc's so that the first declaration is unavailable (Swift
// reads the first one). Apple: fcntl(F_PREALLOCATE), then ftruncate.
int posix_fallocate(int, off_t, off_t) __attribute__((unavailable("not in Apple's SDK: use fcntl(F_PREALLOCATE), then ftruncate")));
#endif
#include_next <fcntl.h>
#ifndef BATON_STUB_APPLE_FCNTL_H
#define BATON_STUB_APPLE_FCNTL_H

#define O_EVTONLY       0x00008000      /* descriptor requested for event notifications only */

#define F_PREALLOCATE   42              /* Preallocate storage */
#define F_FULLFSYNC     51              /* fsync + ask the drive to flush to the media */
#define F_GETPROTECTIONCLASS    63      /* Get the protection class of a file from the EA, returns int */
#define F_SETPROTECTIONCLASS    64      /* Set the protection class of a file for the EA, requires int */

/* allocate flags (F_PREALLOCATE) */
#define F_ALLOCATECONTIG  0x00000002    /* allocate contigious space */
#define F_ALLOCATEALL     0x00000004    /* allocate all requested space or no space at all */
/* Position Modes (fst_posmode) for F_PREALLOCATE */
#define F_PEOFPOSMODE 3
#define F_VOLPOSMODE    4

/* fstore_t type used by F_PREALLOCATE command */
typedef struct fstore {
    unsigned int fst_flags; /* IN: flags word */
    int     fst_posmode;    /* IN: indicates use of offset field */
    off_t   fst_offset;     /* IN: start of the region */
    off_t   fst_length;     /* IN: size of the region */
    off_t   fst_bytesalloc; /* OUT: number of bytes allocated */
} fstore_t;

#endif
