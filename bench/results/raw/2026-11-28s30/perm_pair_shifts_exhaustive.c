#include <stdint.h>
#include <stdio.h>
static uint32_t rotl(uint32_t x,int n){return (x<<n)|(x>>(32-n));}
static uint32_t oldp(uint32_t r,int k){ if(k==0) return r&0x81C081C0u; if(k==1) return rotl(r,3)&0x81C081C0u;
 if(k==2) return (rotl(r,2)&0x80008000u)|(rotl(r,6)&0x01C001C0u); return (rotl(r,1)&0x80008000u)|(rotl(r,29)&0x01C001C0u);}
static uint32_t newp(uint32_t r,int k){ if(k==0) return r&0x81C081C0u; if(k==1) return (r<<3)&0x81C081C0u;
 if(k==2) return ((r<<2)&0x80008000u)|((r<<6)&0x01C001C0u); return ((r<<1)&0x80008000u)|((r>>3)&0x01C001C0u);}
int main(){ uint64_t bad=0; for(uint64_t w=0;w<(1ull<<32);w++){uint32_t r=(uint32_t)w; for(int k=1;k<4;k++) bad+=oldp(r,k)!=newp(r,k);} printf("mismatches %llu\n",(unsigned long long)bad); return bad!=0;}
