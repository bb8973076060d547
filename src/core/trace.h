/*
 * trace.h - where a call spends its host time, for the small-batch rows of the benchmarks
 * (issue 23: at 1K rows the GPU waits for the host). With SPH_HOST_TRACE=1 in the
 * environment, every sph_trace_mark(label) adds the host time since the thread's previous
 * mark (or sph_trace_begin) to the label's sum; at exit the sums are printed to stderr per
 * label, in microseconds per call of the label, largest first. Off (the default) a mark is
 * one load and one branch. Labels are string literals (compared by address).
 */
#ifndef SPH_CORE_TRACE_H
#define SPH_CORE_TRACE_H

#ifdef __cplusplus
extern "C" {
#endif

extern int sph_trace_on; /* set once when the library loads (before any thread of it) */
void sph_trace_begin_(void);
void sph_trace_mark_(const char *label);

static inline int sph_trace_enabled(void) { return sph_trace_on; }
/* The start of a traced call: the next mark counts from here. */
static inline void sph_trace_begin(void) {
    if (sph_trace_enabled()) sph_trace_begin_();
}
/* The host time since the previous mark goes to label. */
static inline void sph_trace_mark(const char *label) {
    if (sph_trace_enabled()) sph_trace_mark_(label);
}

#ifdef __cplusplus
}
#endif

#endif
