#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=atol(argv[1]); char*a=aligned_alloc(4096,1<<24); char*b=aligned_alloc(4096,1<<24);
  memset(a,1,1<<24); memset(b,2,1<<24);
  int ds[]={-4096+64,-64,-32,-16,-8,-1,0,1,8,16,32,48,63,64,65,96,128,256,512,1024,2048,3072,4032,4095};
  for(int i=0;i<sizeof ds/sizeof*ds;i++){
    char*s=a+256; char*d=b+256+ds[i]+4096;
    double best=1e9; for(int r=0;r<5;r++){double t0=now(); for(int k=0;k<200;k++){ memcpy(d,s,n); __asm__ volatile(""::"r"(d):"memory"); } double t=(now()-t0)/200*1e6; if(t<best)best=t;}
    printf("dst-src=%5d  %8.2f us  %5.1f GB/s\n",ds[i],best,n/best/1e3);
  }
}
