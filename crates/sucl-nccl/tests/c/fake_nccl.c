/* A stand-in for the real libnccl.so.2 (not NCCL): a few of its functions, each appending a
 * line to $FAKE_NCCL_LOG, so that a test can see what the drop-in forwarded. It lacks most of
 * the API on purpose (the drop-in must answer those with an error). One rank, so the drop-in
 * never tries to set up peer memory. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int nRanks, rank, stride; } ncclTeam_t;

static void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void say(const char* fmt, ...) {
  FILE* f = fopen(getenv("FAKE_NCCL_LOG"), "a");
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

int ncclGetVersion(int* v) { *v = 22809; say("GetVersion"); return 0; }
int ncclGetUniqueId(ncclUniqueId* id) {
  for (int i = 0; i < 128; i++) id->internal[i] = (char)(i * 7);
  say("GetUniqueId");
  return 0;
}
int ncclCommInitRank(void** comm, int n, ncclUniqueId id, int rank) {
  unsigned sum = 0;
  for (int i = 0; i < 128; i++) sum += (unsigned char)id.internal[i];
  *comm = (void*)0xc0ffee;
  say("CommInitRank n=%d rank=%d idsum=%u", n, rank, sum);
  return 0;
}
int ncclCommCount(void* comm, int* n) { *n = 1; say("CommCount %p", comm); return 0; }
int ncclCommUserRank(void* comm, int* r) { *r = 0; say("CommUserRank %p", comm); return 0; }
int ncclCommCuDevice(void* comm, int* d) { *d = 0; say("CommCuDevice %p", comm); return 0; }
int ncclAllReduce(const void* s, void* r, size_t count, int dt, int op, void* comm, void* stream) {
  say("AllReduce %p %p %zu %d %d %p %p", s, r, count, dt, op, comm, stream);
  return 0;
}
static char last_error[128] = "";
static int broadcasts = 0;
int ncclBroadcast(const void* s, void* r, size_t count, int dt, int root, void* comm, void* stream) {
  say("Broadcast %p %p %zu %d %d %p %p", s, r, count, dt, root, comm, stream);
  snprintf(last_error, sizeof last_error, "fake: broadcast %d failed", ++broadcasts);
  return 4; /* ncclInvalidArgument, to see codes come back */
}
int ncclPutSignal(const void* buf, size_t count, int dt, int peer, void* win, size_t off, int sig, int ctx,
                  unsigned flags, void* comm, void* stream) {
  say("PutSignal %p %zu %d %d %p %zu %d %d %u %p %p", buf, count, dt, peer, win, off, sig, ctx, flags, comm, stream);
  return 0;
}
int ncclGroupStart(void) { say("GroupStart"); return 0; }
int ncclGroupEnd(void) { say("GroupEnd"); return 0; }
int ncclCommDestroy(void* comm) { say("CommDestroy %p", comm); return 0; }
const char* ncclGetErrorString(int code) { say("GetErrorString %d", code); return "fake error string"; }
const char* ncclGetLastError(void* comm) { (void)comm; return last_error; }
ncclTeam_t ncclTeamWorld(void* comm) { ncclTeam_t t = {5, 3, 1}; say("TeamWorld %p", comm); return t; }
