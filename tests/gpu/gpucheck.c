/* gpucheck: proves a CUDA device is usable inside the container. It loads the driver's libcuda.so.1
 * (bound in by Apptainer's --nv), names each visible device, and runs a saxpy kernel given as PTX
 * (JIT-compiled by the driver, so no CUDA toolkit is needed in the image), checking every element. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>

typedef int CUresult; typedef int CUdevice; typedef void *CUcontext, *CUmodule, *CUfunction;
typedef unsigned long long CUdeviceptr;

static const char ptx[] =
".version 7.0\n.target sm_70\n.address_size 64\n"
".visible .entry saxpy(.param .u64 p_x, .param .u64 p_y, .param .f32 p_a, .param .u32 p_n)\n{\n"
" .reg .pred %p<2>; .reg .b32 %r<6>; .reg .f32 %f<5>; .reg .b64 %rd<8>;\n"
" ld.param.u64 %rd1, [p_x]; ld.param.u64 %rd2, [p_y]; ld.param.f32 %f1, [p_a]; ld.param.u32 %r1, [p_n];\n"
" mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x; mad.lo.s32 %r5, %r2, %r3, %r4;\n"
" setp.ge.u32 %p1, %r5, %r1; @%p1 bra DONE;\n"
" cvta.to.global.u64 %rd3, %rd1; cvta.to.global.u64 %rd4, %rd2; mul.wide.u32 %rd5, %r5, 4;\n"
" add.s64 %rd6, %rd3, %rd5; add.s64 %rd7, %rd4, %rd5; ld.global.f32 %f2, [%rd6]; ld.global.f32 %f3, [%rd7];\n"
" fma.rn.f32 %f4, %f1, %f2, %f3; st.global.f32 [%rd7], %f4;\nDONE:\n ret;\n}\n";

#define LOAD(name) name = dlsym(lib, #name); if (!name) { fprintf(stderr, "gpucheck: no %s in libcuda\n", #name); return 2; }
#define CHECK(call) do { CUresult r = (call); if (r) { fprintf(stderr, "gpucheck: %s failed: %d\n", #call, r); return 3; } } while (0)

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "gpucheck: cannot load libcuda.so.1: %s\n", dlerror()); return 2; }
    CUresult (*cuInit)(unsigned), (*cuDeviceGetCount)(int *), (*cuDeviceGet)(CUdevice *, int),
        (*cuDeviceGetName)(char *, int, CUdevice), (*cuDeviceTotalMem_v2)(size_t *, CUdevice),
        (*cuDriverGetVersion)(int *), (*cuCtxCreate_v2)(CUcontext *, unsigned, CUdevice),
        (*cuModuleLoadData)(CUmodule *, const void *), (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *),
        (*cuMemAlloc_v2)(CUdeviceptr *, size_t), (*cuMemcpyHtoD_v2)(CUdeviceptr, const void *, size_t),
        (*cuMemcpyDtoH_v2)(void *, CUdeviceptr, size_t), (*cuCtxSynchronize)(void),
        (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          void *, void **, void **);
    LOAD(cuInit) LOAD(cuDeviceGetCount) LOAD(cuDeviceGet) LOAD(cuDeviceGetName) LOAD(cuDeviceTotalMem_v2)
    LOAD(cuDriverGetVersion) LOAD(cuCtxCreate_v2) LOAD(cuModuleLoadData) LOAD(cuModuleGetFunction)
    LOAD(cuMemAlloc_v2) LOAD(cuMemcpyHtoD_v2) LOAD(cuMemcpyDtoH_v2) LOAD(cuCtxSynchronize) LOAD(cuLaunchKernel)
    CHECK(cuInit(0));
    int count = 0, version = 0;
    CHECK(cuDriverGetVersion(&version));
    CHECK(cuDeviceGetCount(&count));
    printf("gpucheck: driver API %d, %d device(s), CUDA_VISIBLE_DEVICES=%s\n", version, count,
           getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)");
    if (count < 1) return 4;
    CUdevice dev; char name[256]; size_t mem;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    CHECK(cuDeviceTotalMem_v2(&mem, dev));
    printf("gpucheck: device 0: %s, %zu MiB\n", name, mem >> 20);
    CUcontext ctx; CUmodule mod; CUfunction fn;
    CHECK(cuCtxCreate_v2(&ctx, 0, dev));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&fn, mod, "saxpy"));
    unsigned n = 1u << 20; float a = 2.5f;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    for (unsigned i = 0; i < n; i++) { x[i] = (float)i; y[i] = 1.0f; }
    CUdeviceptr dx, dy;
    CHECK(cuMemAlloc_v2(&dx, n * sizeof *x)); CHECK(cuMemAlloc_v2(&dy, n * sizeof *y));
    CHECK(cuMemcpyHtoD_v2(dx, x, n * sizeof *x)); CHECK(cuMemcpyHtoD_v2(dy, y, n * sizeof *y));
    void *args[] = {&dx, &dy, &a, &n};
    CHECK(cuLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH_v2(y, dy, n * sizeof *y));
    for (unsigned i = 0; i < n; i++)
        if (fabsf(y[i] - (a * (float)i + 1.0f)) > 1e-3f * fabsf(a * (float)i + 1.0f)) {
            printf("gpucheck: FAIL at %u: %f\n", i, y[i]); return 5; }
    printf("gpucheck: saxpy on %u elements correct (PTX JIT-compiled by the driver)\n", n);
    return 0;
}
