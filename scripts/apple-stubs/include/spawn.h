// Apple's <spawn.h>, in place of glibc's for the Apple type-check: the types differ (Apple's are
// opaque `void *`, glibc's are structs), so glibc's header is not read at all (its guard
// _SPAWN_H is defined here). Transcribed from apple-oss-distributions/xnu
// libsyscall/wrappers/spawn/spawn.h (commit e7776783) and bsd/sys/spawn.h (commit 5c2921b0):
// the declarations Baton's code can reach, availability attributes left out.
#ifndef BATON_STUB_APPLE_SPAWN_H
#define BATON_STUB_APPLE_SPAWN_H
#define _SPAWN_H 1
#include <sys/types.h>
#include <signal.h>

/* bsd/sys/spawn.h */
#define POSIX_SPAWN_RESETIDS            0x0001  /* [SPN] R[UG]ID not E[UG]ID */
#define POSIX_SPAWN_SETPGROUP           0x0002  /* [SPN] set non-parent PGID */
#define POSIX_SPAWN_SETSIGDEF           0x0004  /* [SPN] reset sigset default */
#define POSIX_SPAWN_SETSIGMASK          0x0008  /* [SPN] set signal mask */
#define POSIX_SPAWN_SETEXEC             0x0040
#define POSIX_SPAWN_START_SUSPENDED     0x0080
#define POSIX_SPAWN_SETSID              0x0400
#define POSIX_SPAWN_CLOEXEC_DEFAULT     0x4000

/* libsyscall/wrappers/spawn/spawn.h */
typedef  void *posix_spawnattr_t;
typedef  void *posix_spawn_file_actions_t;

int     posix_spawn(pid_t * __restrict, const char * __restrict,
    const posix_spawn_file_actions_t *,
    const posix_spawnattr_t * __restrict,
    char *const __argv[__restrict],
    char *const __envp[__restrict]);
int     posix_spawnp(pid_t * __restrict, const char * __restrict,
    const posix_spawn_file_actions_t *,
    const posix_spawnattr_t * __restrict,
    char *const __argv[__restrict],
    char *const __envp[__restrict]);
int     posix_spawn_file_actions_addclose(posix_spawn_file_actions_t *, int);
int     posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *, int, int);
int     posix_spawn_file_actions_addopen(
	posix_spawn_file_actions_t * __restrict, int,
	const char * __restrict, int, mode_t);
int     posix_spawn_file_actions_destroy(posix_spawn_file_actions_t *);
int     posix_spawn_file_actions_init(posix_spawn_file_actions_t *);
int     posix_spawnattr_destroy(posix_spawnattr_t *);
int     posix_spawnattr_getsigdefault(const posix_spawnattr_t * __restrict, sigset_t * __restrict);
int     posix_spawnattr_getflags(const posix_spawnattr_t * __restrict, short * __restrict);
int     posix_spawnattr_getpgroup(const posix_spawnattr_t * __restrict, pid_t * __restrict);
int     posix_spawnattr_getsigmask(const posix_spawnattr_t * __restrict, sigset_t * __restrict);
int     posix_spawnattr_init(posix_spawnattr_t *);
int     posix_spawnattr_setsigdefault(posix_spawnattr_t * __restrict, const sigset_t * __restrict);
int     posix_spawnattr_setflags(posix_spawnattr_t *, short);
int     posix_spawnattr_setpgroup(posix_spawnattr_t *, pid_t);
int     posix_spawnattr_setsigmask(posix_spawnattr_t * __restrict, const sigset_t * __restrict);
int     posix_spawn_file_actions_addinherit_np(posix_spawn_file_actions_t *, int);
int     posix_spawn_file_actions_addchdir_np(posix_spawn_file_actions_t *, const char * __restrict);
int     posix_spawn_file_actions_addfchdir_np(posix_spawn_file_actions_t *, int);
#endif
