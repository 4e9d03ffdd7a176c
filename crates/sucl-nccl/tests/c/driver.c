/* Calls the drop-in libnccl.so.2 as a program built against NCCL would, and prints what came
 * back, one "what = value" line each; tests/forwarding.rs checks the lines. */
#include <stddef.h>
#include <stdio.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int nRanks, rank, stride; } ncclTeam_t;
typedef void* ncclComm_t;

int ncclGetVersion(int*);
int ncclGetUniqueId(ncclUniqueId*);
int ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int);
int ncclAllReduce(const void*, void*, size_t, int, int, ncclComm_t, void*);
int pncclAllReduce(const void*, void*, size_t, int, int, ncclComm_t, void*);
int ncclBroadcast(const void*, void*, size_t, int, int, ncclComm_t, void*);
int ncclPutSignal(const void*, size_t, int, int, void*, size_t, int, int, unsigned, ncclComm_t, void*);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclCommDestroy(ncclComm_t);
int ncclCommRevoke(ncclComm_t, int);
int ncclCommSuspend(ncclComm_t, int);
const char* ncclGetErrorString(int);
const char* ncclGetLastError(ncclComm_t);
ncclTeam_t ncclTeamWorld(ncclComm_t);
ncclTeam_t ncclTeamLsa(ncclComm_t);
int ncclLLA2ACalcSlots(int, int);
void ncclParamDumpAll(void);

int main(void) {
  int v = -1;
  int rc = ncclGetVersion(&v);
  printf("GetVersion = %d %d\n", rc, v);
  ncclUniqueId id;
  rc = ncclGetUniqueId(&id);
  printf("GetUniqueId = %d\n", rc);
  ncclComm_t comm = NULL;
  rc = ncclCommInitRank(&comm, 1, id, 0);
  printf("CommInitRank = %d %p\n", rc, comm);
  printf("AllReduce = %d\n", ncclAllReduce((void*)0x10, (void*)0x20, 12345, 7, 0, comm, (void*)0x30));
  printf("pAllReduce = %d\n", pncclAllReduce((void*)0x11, (void*)0x21, 99, 9, 4, comm, (void*)0x31));
  printf("Broadcast = %d\n", ncclBroadcast((void*)0x12, (void*)0x22, 7, 2, 1, comm, (void*)0x32));
  printf("PutSignal = %d\n", ncclPutSignal((void*)0x13, 8, 7, 1, (void*)0x40, 16, 2, 3, 4u, comm, (void*)0x33));
  int g1 = ncclGroupStart();
  int g2 = ncclGroupEnd();
  printf("Group = %d %d\n", g1, g2);
  rc = ncclCommRevoke(comm, 0);
  printf("CommRevoke = %d\n", rc);
  printf("LastError after CommRevoke = %s\n", ncclGetLastError(NULL));
  rc = ncclCommSuspend(comm, 0);
  printf("CommSuspend = %d\n", rc);
  printf("LastError after CommSuspend = %s\n", ncclGetLastError(NULL));
  rc = ncclBroadcast((void*)0x12, (void*)0x22, 7, 2, 1, comm, (void*)0x32);
  printf("LastError after a real error = %s\n", ncclGetLastError(NULL));
  const char* s = ncclGetErrorString(3);
  printf("GetErrorString = %s\n", s ? s : "(null)");
  ncclTeam_t t = ncclTeamWorld(comm);
  printf("TeamWorld = %d %d %d\n", t.nRanks, t.rank, t.stride);
  t = ncclTeamLsa(comm);
  printf("TeamLsa = %d %d %d\n", t.nRanks, t.rank, t.stride);
  printf("LLA2ACalcSlots = %d\n", ncclLLA2ACalcSlots(4, 8));
  ncclParamDumpAll();
  printf("CommDestroy = %d\n", ncclCommDestroy(comm));
  printf("done\n");
  return 0;
}
