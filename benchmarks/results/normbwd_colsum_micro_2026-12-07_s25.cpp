#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>
#include <algorithm>
#include <cstring>
static double tt(){timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+1e-9*t.tv_nsec;}
#ifndef H
#define H 768
#endif
#define N (3145728/H)
// variant a: current
__attribute__((noinline)) void va(const float* dy,const float* w,const float* x,const float* mean,const float* rstd,float* dx,float* g,float* b){
  float part0[H]={0}, part1[H]={0};
  for(int64_t i=0;i<N;++i){
    float a4=0,a5=0; float mu=mean[i], rs=rstd[i];
    #pragma omp simd reduction(+:a4) reduction(+:a5)
    for(int64_t j=0;j<H;++j){float t9=dy[i*H+j]*w[j]; a4+=t9; a5+=(x[i*H+j]-mu)*rs*t9;}
    #pragma omp simd
    for(int64_t j=0;j<H;++j){float d=dy[i*H+j]; float t21=d*w[j]; float xh=(x[i*H+j]-mu)*rs;
      dx[i*H+j]=(rs/H)*((t21*H-a4)-xh*a5); part0[j]+=d*xh; part1[j]+=d;}
  }
  for(int j=0;j<H;++j){g[j]=part0[j];b[j]=part1[j];}
}
// variant b: rows in blocks of R, column pass per block
template<int R> __attribute__((noinline)) void vb(const float* dy,const float* w,const float* x,const float* mean,const float* rstd,float* dx,float* g,float* b){
  float part0[H]={0}, part1[H]={0};
  for(int64_t i0=0;i0<N;i0+=R){
    int64_t ie=std::min<int64_t>(i0+R,N);
    for(int64_t i=i0;i<ie;++i){
    float a4=0,a5=0; float mu=mean[i], rs=rstd[i];
    #pragma omp simd reduction(+:a4) reduction(+:a5)
    for(int64_t j=0;j<H;++j){float t9=dy[i*H+j]*w[j]; a4+=t9; a5+=(x[i*H+j]-mu)*rs*t9;}
    #pragma omp simd
    for(int64_t j=0;j<H;++j){float d=dy[i*H+j]; float t21=d*w[j]; float xh=(x[i*H+j]-mu)*rs;
      dx[i*H+j]=(rs/H)*((t21*H-a4)-xh*a5);}
    }
    #pragma omp simd
    for(int64_t j=0;j<H;++j){ float s0=0,s1=0;
      for(int64_t i=i0;i<ie;++i){float d=dy[i*H+j]; s0+=d*((x[i*H+j]-mean[i])*rstd[i]); s1+=d;}
      part0[j]+=s0; part1[j]+=s1;}
  }
  for(int j=0;j<H;++j){g[j]=part0[j];b[j]=part1[j];}
}
// variant c: column adds in pass1 (reduction pass) instead of dx pass
__attribute__((noinline)) void vc(const float* dy,const float* w,const float* x,const float* mean,const float* rstd,float* dx,float* g,float* b){
  float part0[H]={0}, part1[H]={0};
  for(int64_t i=0;i<N;++i){
    float a4=0,a5=0; float mu=mean[i], rs=rstd[i];
    #pragma omp simd reduction(+:a4) reduction(+:a5)
    for(int64_t j=0;j<H;++j){float d=dy[i*H+j];float t9=d*w[j]; a4+=t9; float xh=(x[i*H+j]-mu)*rs; a5+=xh*t9; part0[j]+=d*xh; part1[j]+=d;}
    #pragma omp simd
    for(int64_t j=0;j<H;++j){float d=dy[i*H+j]; float t21=d*w[j]; float xh=(x[i*H+j]-mu)*rs;
      dx[i*H+j]=(rs/H)*((t21*H-a4)-xh*a5);}
  }
  for(int j=0;j<H;++j){g[j]=part0[j];b[j]=part1[j];}
}
// variant n: no column sums at all (lower bound)
__attribute__((noinline)) void vn(const float* dy,const float* w,const float* x,const float* mean,const float* rstd,float* dx,float* g,float* b){
  for(int64_t i=0;i<N;++i){
    float a4=0,a5=0; float mu=mean[i], rs=rstd[i];
    #pragma omp simd reduction(+:a4) reduction(+:a5)
    for(int64_t j=0;j<H;++j){float t9=dy[i*H+j]*w[j]; a4+=t9; a5+=(x[i*H+j]-mu)*rs*t9;}
    #pragma omp simd
    for(int64_t j=0;j<H;++j){float d=dy[i*H+j]; float t21=d*w[j]; float xh=(x[i*H+j]-mu)*rs;
      dx[i*H+j]=(rs/H)*((t21*H-a4)-xh*a5);}
  }
}

__attribute__((noinline)) void vf4(const float* dy,const float* w,const float* x,const float* mean,const float* rstd,float* dx,float* g,float* b){
  float part0[H]={0}, part1[H]={0};
  for(int64_t i0=0;i0<N;i0+=4){
    float s4_0=0,s5_0=0; float mu0=mean[i0+0], rs0=rstd[i0+0];
    #pragma omp simd reduction(+:s4_0) reduction(+:s5_0)
    for(int64_t j=0;j<H;++j){float t9=dy[(i0+0)*H+j]*w[j]; s4_0+=t9; s5_0+=(x[(i0+0)*H+j]-mu0)*rs0*t9;}
    float s4_1=0,s5_1=0; float mu1=mean[i0+1], rs1=rstd[i0+1];
    #pragma omp simd reduction(+:s4_1) reduction(+:s5_1)
    for(int64_t j=0;j<H;++j){float t9=dy[(i0+1)*H+j]*w[j]; s4_1+=t9; s5_1+=(x[(i0+1)*H+j]-mu1)*rs1*t9;}
    float s4_2=0,s5_2=0; float mu2=mean[i0+2], rs2=rstd[i0+2];
    #pragma omp simd reduction(+:s4_2) reduction(+:s5_2)
    for(int64_t j=0;j<H;++j){float t9=dy[(i0+2)*H+j]*w[j]; s4_2+=t9; s5_2+=(x[(i0+2)*H+j]-mu2)*rs2*t9;}
    float s4_3=0,s5_3=0; float mu3=mean[i0+3], rs3=rstd[i0+3];
    #pragma omp simd reduction(+:s4_3) reduction(+:s5_3)
    for(int64_t j=0;j<H;++j){float t9=dy[(i0+3)*H+j]*w[j]; s4_3+=t9; s5_3+=(x[(i0+3)*H+j]-mu3)*rs3*t9;}
    #pragma omp simd
    for(int64_t j=0;j<H;++j){ float p0=0,p1=0; float wj=w[j]; {float d=dy[(i0+0)*H+j]; float t21=d*wj; float xh=(x[(i0+0)*H+j]-mu0)*rs0; dx[(i0+0)*H+j]=(rs0/H)*((t21*H-s4_0)-xh*s5_0); p0+=d*xh; p1+=d;} {float d=dy[(i0+1)*H+j]; float t21=d*wj; float xh=(x[(i0+1)*H+j]-mu1)*rs1; dx[(i0+1)*H+j]=(rs1/H)*((t21*H-s4_1)-xh*s5_1); p0+=d*xh; p1+=d;} {float d=dy[(i0+2)*H+j]; float t21=d*wj; float xh=(x[(i0+2)*H+j]-mu2)*rs2; dx[(i0+2)*H+j]=(rs2/H)*((t21*H-s4_2)-xh*s5_2); p0+=d*xh; p1+=d;} {float d=dy[(i0+3)*H+j]; float t21=d*wj; float xh=(x[(i0+3)*H+j]-mu3)*rs3; dx[(i0+3)*H+j]=(rs3/H)*((t21*H-s4_3)-xh*s5_3); p0+=d*xh; p1+=d;} part0[j]+=p0; part1[j]+=p1;}
  }
  for(int j=0;j<H;++j){g[j]=part0[j];b[j]=part1[j];}
}

__attribute__((noinline)) void vg8_128(const float* dy,const float* w,const float* x,const float* mean,const float* rstd,float* dx,float* g,float* b){
  float part0[H]={0}, part1[H]={0};
  for(int64_t i0=0;i0<N;i0+=8){
    float s4[8],s5[8];
    for(int r=0;r<8;++r){ int64_t i=i0+r;
    float a4=0,a5=0; float mu=mean[i], rs=rstd[i];
    #pragma omp simd reduction(+:a4) reduction(+:a5)
    for(int64_t j=0;j<H;++j){float t9=dy[i*H+j]*w[j]; a4+=t9; a5+=(x[i*H+j]-mu)*rs*t9;}
    s4[r]=a4; s5[r]=a5;}
    for(int64_t jc=0;jc<H;jc+=128){
      float c0[128]={0}, c1[128]={0};
      for(int r=0;r<8;++r){ int64_t i=i0+r; float mu=mean[i], rs=rstd[i], a4=s4[r], a5=s5[r];
        #pragma omp simd
        for(int64_t jj=0;jj<128;++jj){ int64_t j=jc+jj; float d=dy[i*H+j]; float t21=d*w[j]; float xh=(x[i*H+j]-mu)*rs;
          dx[i*H+j]=(rs/H)*((t21*H-a4)-xh*a5); c0[jj]+=d*xh; c1[jj]+=d;}
      }
      #pragma omp simd
      for(int64_t jj=0;jj<128;++jj){ part0[jc+jj]+=c0[jj]; part1[jc+jj]+=c1[jj]; }
    }
  }
  for(int j=0;j<H;++j){g[j]=part0[j];b[j]=part1[j];}
}

__attribute__((noinline)) void vh16_128(const float* dy,const float* w,const float* x,const float* mean,const float* rstd,float* dx,float* g,float* b){
  float part0[H]={0}, part1[H]={0};
  for(int64_t i0=0;i0<N;i0+=16){
    for(int r=0;r<16;++r){ int64_t i=i0+r;
    float a4=0,a5=0; float mu=mean[i], rs=rstd[i];
    #pragma omp simd reduction(+:a4) reduction(+:a5)
    for(int64_t j=0;j<H;++j){float t9=dy[i*H+j]*w[j]; a4+=t9; a5+=(x[i*H+j]-mu)*rs*t9;}
    #pragma omp simd
    for(int64_t j=0;j<H;++j){float d=dy[i*H+j]; float t21=d*w[j]; float xh=(x[i*H+j]-mu)*rs;
      dx[i*H+j]=(rs/H)*((t21*H-a4)-xh*a5);}
    }
    for(int64_t jc=0;jc<H;jc+=128){
      float c0[128]={0}, c1[128]={0};
      for(int r=0;r<16;++r){ int64_t i=i0+r; float mu=mean[i], rs=rstd[i];
        #pragma omp simd
        for(int64_t jj=0;jj<128;++jj){ int64_t j=jc+jj; float d=dy[i*H+j]; float xh=(x[i*H+j]-mu)*rs; c0[jj]+=d*xh; c1[jj]+=d;}
      }
      #pragma omp simd
      for(int64_t jj=0;jj<128;++jj){ part0[jc+jj]+=c0[jj]; part1[jc+jj]+=c1[jj]; }
    }
  }
  for(int j=0;j<H;++j){g[j]=part0[j];b[j]=part1[j];}
}
typedef void (*F)(const float*,const float*,const float*,const float*,const float*,float*,float*,float*);
int main(){
  std::vector<float> dy(N*H),x(N*H),dx(N*H),w(H),mean(N),rstd(N),g(H),b(H);
  for(auto&v:dy)v=rand()/(float)RAND_MAX-0.5f; for(auto&v:x)v=rand()/(float)RAND_MAX; for(auto&v:w)v=1.1f;
  for(auto&v:mean)v=0.5f; for(auto&v:rstd)v=3.f;
  F fs[]={va,vb<8>,vc,vf4,vg8_128,vh16_128,vn}; const char* nm[]={"a_now(main)","b_R8_jouter","c_in_pass1","f_4rows_fused","g_8rows_128col_regs","h_16rows_colpass","n_no_column_sums"};
  const int K=7; std::vector<double> t[K];
  for(int rd=0;rd<21;++rd) for(int k=0;k<K;++k){double s=tt(); fs[k](dy.data(),w.data(),x.data(),mean.data(),rstd.data(),dx.data(),g.data(),b.data()); t[k].push_back(tt()-s);}
  for(int k=0;k<K;++k){std::sort(t[k].begin(),t[k].end()); printf("%-20s med %.3f ms min %.3f max %.3f  g0=%g\n",nm[k],t[k][10]*1e3,t[k][0]*1e3,t[k][20]*1e3,(double)g[0]);}
}
