/* ggml-cpu's own dot products timed the way ork's blocks_speed example times its kernels: one
 * thread, a ROWS x K weight matrix of TYPE against M activation rows quantized by ggml's
 * from_float of the type's vec_dot_type, every row through ggml's vec_dot (as ggml's mul_mat
 * calls it), repeated for SECONDS. Prints GB/s of weight bytes per second of wall time and of the thread's
 * CPU time. Built and run by
 * scripts/blocks-speed.sh against llama-cpp-python's libggml-cpu.so. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*from_float_t)(const float *, void *, int64_t);
typedef void (*vec_dot_t)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
struct traits { from_float_t from_float; vec_dot_t vec_dot; int vec_dot_type; int64_t nrows; };
typedef const struct traits *(*get_traits_t)(int);

static double clock_s(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: LIB TYPE-ID BLOCK-LEN BLOCK-BYTES K ROWS M SECONDS ACT-BLOCK-BYTES\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    ((void (*)(void))dlsym(lib, "ggml_cpu_init"))();
    get_traits_t get = (get_traits_t)dlsym(lib, "ggml_get_type_traits_cpu");
    int ty = atoi(argv[2]), blen = atoi(argv[3]), bbytes = atoi(argv[4]);
    int k = atoi(argv[5]), rows = atoi(argv[6]), m = atoi(argv[7]);
    double secs = atof(argv[8]);
    int abytes = atoi(argv[9]);
    const struct traits *tr = get(ty);
    const struct traits *at = get(tr->vec_dot_type);
    size_t wrb = (size_t)k / blen * bbytes, arb = (size_t)k / (abytes == 4 ? 1 : abytes == 2 ? 1 : 32) * abytes;
    uint8_t *w = malloc(wrb * rows), *a = malloc(arb * m);
    float *x = malloc(sizeof(float) * k * m), *out = malloc(sizeof(float) * rows * m);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < wrb * rows; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; w[i] = (uint8_t)s; }
    if (blen > 1)
        for (size_t b = 0; b < wrb * rows / bbytes; b++) { uint8_t *p = w + b * bbytes; p[0] = 0; p[1] = 0x20; p[2] = 0; p[3] = 0x20; }
    else if (bbytes == 2)
        for (size_t i = 1; i < wrb * rows; i += 2) w[i] = 0x3c | (w[i] & 3); /* as ork's example */
    else
        for (size_t i = 0; i < (size_t)k * rows; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; ((float *)w)[i] = (float)(s % 1000) / 1000.0f; }
    for (int i = 0; i < k * m; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; x[i] = (float)(s % 2001) / 1000.0f - 1.0f; }
    double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), t0 = now();
    long n = 0;
    while (now() - t0 < secs || n < 3) {
        for (int i = 0; i < m; i++) {
            if (at->from_float) at->from_float(x + (size_t)i * k, a + i * arb, k);
            else memcpy(a + i * arb, x + (size_t)i * k, arb);
        }
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < m; i++)
                tr->vec_dot(k, out + (size_t)r * m + i, 0, w + r * wrb, 0, a + i * arb, 0, 1);
        n++;
    }
    double t = (now() - t0) / n, tc = (clock_s(CLOCK_THREAD_CPUTIME_ID) - c0) / n;
    double sum = 0;
    for (int i = 0; i < rows * m; i++) sum += out[i];
    printf("{\"ggml_gbps\": %.3f, \"ggml_cpu_gbps\": %.3f, \"checksum\": %g}\n", wrb * rows / t / 1e9,
           wrb * rows / tc / 1e9, sum);
    return 0;
}
