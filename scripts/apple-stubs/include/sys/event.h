// Stub of xnu's <sys/event.h> (kqueue), for type-checking Baton's Apple code on Linux.
// Source: apple-oss-distributions/xnu bsd/sys/event.h (commit 1031c584). Only what Baton uses;
// values and layout kept.
#ifndef BATON_STUB_SYS_EVENT_H
#define BATON_STUB_SYS_EVENT_H
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define EVFILT_VNODE            (-4)    /* attached to vnodes */

#pragma pack(4)
struct kevent {
    uintptr_t       ident;  /* identifier for this event */
    int16_t         filter; /* filter for event */
    uint16_t        flags;  /* general flags */
    uint32_t        fflags; /* filter-specific flags */
    intptr_t        data;   /* filter-specific data */
    void            *udata; /* opaque user data identifier */
};
#pragma pack()

/* actions */
// EV_SET: as in xnu bsd/sys/event.h (a macro that fills a struct kevent).
#define EV_SET(kevp, a, b, c, d, e, f) do {     \
	struct kevent *__kevp__ = (kevp);       \
	__kevp__->ident = (a);                  \
	__kevp__->filter = (b);                 \
	__kevp__->flags = (c);                  \
	__kevp__->fflags = (d);                 \
	__kevp__->data = (e);                   \
	__kevp__->udata = (f);                  \
} while(0)

#define EV_ADD              0x0001
#define EV_DELETE           0x0002
#define EV_ENABLE           0x0004
/* flags */
#define EV_ONESHOT          0x0010
#define EV_CLEAR            0x0020
/* returned values */
#define EV_ERROR            0x4000

/* data/hint fflags for EVFILT_VNODE */
#define NOTE_DELETE     0x00000001
#define NOTE_WRITE      0x00000002
#define NOTE_EXTEND     0x00000004
#define NOTE_ATTRIB     0x00000008
#define NOTE_LINK       0x00000010
#define NOTE_RENAME     0x00000020
#define NOTE_REVOKE     0x00000040
#define NOTE_FUNLOCK    0x00000100              /* vnode was unlocked by flock(2) */

struct timespec;
int     kqueue(void);
int     kevent(int kq,
    const struct kevent *changelist, int nchanges,
    struct kevent *eventlist, int nevents,
    const struct timespec *timeout);

#endif
