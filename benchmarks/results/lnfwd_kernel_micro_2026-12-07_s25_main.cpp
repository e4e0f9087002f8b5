#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>
#include <algorithm>
extern "C" void kernel0(const float* arg2, float* buf2, float* buf3, const float* arg0, const float* arg1, float* buf4);
extern "C" void kernel0f(const float* arg2, float* buf2, float* buf3, const float* arg0, const float* arg1, float* buf4);
static double tt(){timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+1e-9*t.tv_nsec;}
int main(){
  const int64_t N=4096, H=768;
  std::vector<float> x(N*H), y(N*H), w(H,1.f), b(H,0.f), mu(N), rs(N);
  for(auto&v:x) v=rand()/(float)RAND_MAX;
  std::vector<double> t0,t1;
  for(int r=0;r<21;++r){double s=tt(); kernel0(x.data(),mu.data(),rs.data(),w.data(),b.data(),y.data()); t0.push_back(tt()-s);
    s=tt(); kernel0f(x.data(),mu.data(),rs.data(),w.data(),b.data(),y.data()); t1.push_back(tt()-s);}
  std::sort(t0.begin(),t0.end()); std::sort(t1.begin(),t1.end());
  printf("double stats (generated) med %.3f ms [%.3f-%.3f]; float stats med %.3f ms [%.3f-%.3f]\n",t0[10]*1e3,t0[0]*1e3,t0[20]*1e3,t1[10]*1e3,t1[0]*1e3,t1[20]*1e3);
}
