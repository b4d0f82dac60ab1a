/*
 * hmk-membw: a small STREAM-like DRAM bandwidth probe for the validate role of hybrid-moe-kit.
 *
 * Two kernels over arrays of MIB mebibytes each, run by every OpenMP thread on its own static slice
 * (first-touch places each slice's pages on the NUMA node of the thread that reads it):
 *   read  - sum of one array (read-only, like the routed experts a generating engine streams; the simd
 *           reduction lets the compiler keep several partial sums, so the adds do not bound the loop);
 *   triad - a[i] = b[i] + s * c[i] (STREAM's convention: 3 arrays of traffic, write-allocate not counted).
 * The best of RUNS repetitions is reported, as JSON on stdout, in GB/s (10^9 bytes per second).
 *
 * Build: gcc -O3 -march=native -fopenmp -o hmk-membw hmk-membw.c
 * Usage: hmk-membw [MIB] [RUNS]        (defaults 1024 and 5; OMP_NUM_THREADS picks the thread count)
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long parse_positive(const char *text, const char *what)
{
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value <= 0) {
        fprintf(stderr, "hmk-membw: %s must be a positive integer, got \"%s\"\n", what, text);
        exit(2);
    }
    return value;
}

int main(int argc, char **argv)
{
    long mib = argc > 1 ? parse_positive(argv[1], "MIB") : 1024;
    long runs = argc > 2 ? parse_positive(argv[2], "RUNS") : 5;
    size_t n = (size_t)mib * 1024 * 1024 / sizeof(double);
    double *a = NULL, *b = NULL, *c = NULL;

    if (posix_memalign((void **)&a, 4096, n * sizeof(double)) != 0 ||
        posix_memalign((void **)&b, 4096, n * sizeof(double)) != 0 ||
        posix_memalign((void **)&c, 4096, n * sizeof(double)) != 0) {
        fprintf(stderr, "hmk-membw: cannot allocate 3 x %ld MiB\n", mib);
        return 1;
    }

#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        a[i] = 0.0;
        b[i] = 1.0 + (double)(i & 7);
        c[i] = 0.5;
    }

    double best_read = 0.0, best_triad = 0.0, checksum = 0.0;
    const double scalar = 3.0;
    for (long run = 0; run < runs; run++) {
        double sum = 0.0;
        double start = now();
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
        for (size_t i = 0; i < n; i++)
            sum += b[i];
        double seconds = now() - start;
        checksum += sum;
        double rate = (double)n * sizeof(double) / seconds / 1e9;
        if (rate > best_read)
            best_read = rate;

        start = now();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            a[i] = b[i] + scalar * c[i];
        seconds = now() - start;
        checksum += a[n / 2];
        rate = 3.0 * (double)n * sizeof(double) / seconds / 1e9;
        if (rate > best_triad)
            best_triad = rate;
    }

    /* The checksum keeps the compiler from dropping the loops; printing it proves they ran. */
    printf("{\"tool\": \"hmk-membw\", \"version\": 1, \"threads\": %d, \"array_mib\": %ld, \"runs\": %ld, "
           "\"read_gbps\": %.3f, \"triad_gbps\": %.3f, \"checksum\": %.1f}\n",
           omp_get_max_threads(), mib, runs, best_read, best_triad, checksum);
    free(a);
    free(b);
    free(c);
    return 0;
}
