/*
 * pack.c - bin packing of sequence lengths (docs/design.md section 3.7).
 *
 * A sequence of raw length L costs its padded length c = ceil(L / a_s) a_s (a_s the sequence
 * alignment of par). Bins hold at most K_eff = floor(capacity / a_t) a_t tokens (a_t the total
 * alignment): then the packed layout of any bin (sph_layout_packed, whose final segment grows
 * the total to a multiple of a_t) still fits in capacity.
 *
 *   FFD      items by decreasing cost (ties: lower index first), each into the lowest-numbered
 *            bin with room, else a new bin. A max segment tree over the bins' free room finds
 *            the first fit in O(log n); unopened bins sit in the tree with full room, so "open
 *            a new bin" is the same query. O(n log n).
 *   MFFD     Johnson & Garey's modified FFD (A 71/60 theorem for bin packing, J. Complexity
 *            1985): classes large (> K/2), medium (> K/3), small (> K/6), tiny. (1) each large
 *            item opens a bin, largest first; (2) forward over those bins, add the largest
 *            medium item that fits; (3) backward over the bins still holding only their large
 *            item, if the two smallest small items fit, add the smallest small item and the
 *            largest small item that fits beside it; (4) forward over all bins, while the
 *            smallest remaining item fits, add the largest remaining item that fits; (5) FFD
 *            for the rest. "Largest remaining item <= g" is a binary search in the ascending
 *            cost order plus a union-find that skips taken items (near O(1) amortized).
 *   balanced least-loaded with a soft cap: an item larger than K_eff gets a bin of its own (the
 *            only way a bin exceeds capacity); the others, by decreasing cost, go to the
 *            least-loaded bin (a min-heap on (load, bin)) when they fit there, else to a new
 *            bin. It starts from max(ceil(sum / K_eff), min_bins) bins rounded to bin_multiple,
 *            so loads come out even rather than front-loaded.
 *
 * Bin-count adjustment (min_bins, bin_multiple): the target is the least multiple of
 * bin_multiple >= max(bins, min_bins). While short, the fullest bin holding at least two items
 * (ties: lower bin) gives its largest item (ties: lower index) to a new bin. New bins hold one
 * item (<= K_eff, or an oversized balanced item that was already alone), donors shrink, so no
 * capacity breaks and no bin empties. Infeasible exactly when the target exceeds the number of
 * sequences. Every choice has a fixed tie-break: the output is a function of the input.
 * Inside a bin, items are listed by increasing sequence index.
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "pack/pack_internal.h"

typedef struct item {
    int64_t cost;
    int64_t idx;
} item;

static int cmp_desc(const void *pa, const void *pb) {
    const item *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

// ---- first-fit segment tree -----------------------------------------------------------------

typedef struct fit_tree {
    int64_t *t; /* [2 * size]; t[size + b] = free room of bin b, inner nodes = max of children */
    int64_t size;
} fit_tree;

static bool tree_init(fit_tree *ft, int64_t n_leaves, int64_t room) {
    ft->size = 1;
    while (ft->size < n_leaves) ft->size *= 2;
    ft->t = sph_malloc(sizeof(int64_t) * 2 * (size_t)ft->size);
    if (!ft->t) return false;
    for (int64_t i = 0; i < ft->size; i++) ft->t[ft->size + i] = i < n_leaves ? room : -1;
    for (int64_t i = ft->size - 1; i >= 1; i--)
        ft->t[i] = ft->t[2 * i] > ft->t[2 * i + 1] ? ft->t[2 * i] : ft->t[2 * i + 1];
    return true;
}

static void tree_set(fit_tree *ft, int64_t b, int64_t room) {
    int64_t i = ft->size + b;
    ft->t[i] = room;
    for (i /= 2; i >= 1; i /= 2)
        ft->t[i] = ft->t[2 * i] > ft->t[2 * i + 1] ? ft->t[2 * i] : ft->t[2 * i + 1];
}

/* Lowest bin with room >= c, or -1. */
static int64_t tree_first(const fit_tree *ft, int64_t c) {
    if (ft->t[1] < c) return -1;
    int64_t i = 1;
    while (i < ft->size) i = ft->t[2 * i] >= c ? 2 * i : 2 * i + 1;
    return i - ft->size;
}

/* FFD of the items desc[0..n) not yet placed (bin_of[idx] < 0) into the tree's bins. */
static sph_status ffd_place(const item *desc, int64_t n, fit_tree *ft, int64_t cap,
                            int64_t *load, int64_t *bin_of, int64_t *n_bins) {
    for (int64_t i = 0; i < n; i++) {
        if (bin_of[desc[i].idx] >= 0) continue;
        const int64_t b = tree_first(ft, desc[i].cost);
        if (b < 0) return sph_err(SPH_ERR_INTERNAL, "pack: no bin fits item %lld",
                                  (long long)desc[i].idx);
        load[b] += desc[i].cost;
        tree_set(ft, b, cap - load[b]);
        bin_of[desc[i].idx] = b;
        if (b + 1 > *n_bins) *n_bins = b + 1;
    }
    return SPH_OK;
}

// ---- union-find over an ascending cost order: skip taken items --------------------------------

typedef struct skipper {
    int64_t *left;  /* [n + 1]; find_left(i) = largest untaken <= i, stored shifted by one */
    int64_t *right; /* [n + 1]; find_right(i) = smallest untaken >= i, n if none */
    int64_t n;
} skipper;

static int64_t find_left(skipper *s, int64_t i) {
    int64_t x = i + 1;
    while (s->left[x] != x) {
        s->left[x] = s->left[s->left[x]];
        x = s->left[x];
    }
    return x - 1;
}

static int64_t find_right(skipper *s, int64_t i) {
    int64_t x = i;
    while (s->right[x] != x) {
        s->right[x] = s->right[s->right[x]];
        x = s->right[x];
    }
    return x;
}

static void take(skipper *s, int64_t i) {
    s->left[i + 1] = i;
    s->right[i] = i + 1;
}

/* Largest position p in asc[0..n) with asc[p].cost <= g, or -1. */
static int64_t last_le(const item *asc, int64_t n, int64_t g) {
    int64_t lo = 0, hi = n; /* first position with cost > g */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (asc[mid].cost <= g) lo = mid + 1;
        else hi = mid;
    }
    return lo - 1;
}

static sph_status mffd(const item *desc, int64_t n, int64_t cap, int64_t *load,
                       int64_t *bin_of, int64_t *n_bins) {
    sph_status st = SPH_OK;
    item *asc = sph_malloc(sizeof(item) * (size_t)(n + 1));
    skipper sk = {sph_malloc(sizeof(int64_t) * (size_t)(n + 1)),
                  sph_malloc(sizeof(int64_t) * (size_t)(n + 1)), n};
    int64_t *has_medium = NULL;
    fit_tree ft = {NULL, 0};
    if (!asc || !sk.left || !sk.right) goto oom;
    for (int64_t i = 0; i < n; i++) asc[i] = desc[n - 1 - i];
    for (int64_t i = 0; i <= n; i++) sk.left[i] = sk.right[i] = i;
    /* class boundaries in asc: tiny [0,e_t) small [e_t,e_s) medium [e_s,e_m) large [e_m,n);
     * c > K/k for integers is c > floor(K/k) */
    const int64_t e_t = last_le(asc, n, cap / 6) + 1, e_s = last_le(asc, n, cap / 3) + 1,
                  e_m = last_le(asc, n, cap / 2) + 1;
    const int64_t n_large = n - e_m;
    has_medium = sph_calloc((size_t)n_large + 1, sizeof(int64_t));
    if (!has_medium) goto oom;
    /* (1) one bin per large item, largest first: bin b holds asc[n-1-b] */
    for (int64_t b = 0; b < n_large; b++) {
        const int64_t p = n - 1 - b;
        take(&sk, p);
        load[b] = asc[p].cost;
        bin_of[asc[p].idx] = b;
    }
    *n_bins = n_large;
    /* (2) forward: the largest medium item that fits */
    for (int64_t b = 0; b < n_large; b++) {
        const int64_t g = cap - load[b], lo = find_right(&sk, e_s);
        if (lo >= e_m || asc[lo].cost > g) continue;
        int64_t p = last_le(asc, n, g);
        if (p > e_m - 1) p = e_m - 1;
        p = find_left(&sk, p);
        if (p < e_s) continue;
        take(&sk, p);
        load[b] += asc[p].cost;
        bin_of[asc[p].idx] = b;
        has_medium[b] = 1;
    }
    /* (3) backward over bins holding only their large item: two small items */
    for (int64_t b = n_large - 1; b >= 0; b--) {
        if (has_medium[b]) continue;
        const int64_t g = cap - load[b];
        const int64_t s1 = find_right(&sk, e_t);
        if (s1 >= e_s) break; /* no small item left */
        const int64_t s2 = find_right(&sk, s1 + 1);
        if (s2 >= e_s || asc[s1].cost + asc[s2].cost > g) continue;
        take(&sk, s1);
        load[b] += asc[s1].cost;
        bin_of[asc[s1].idx] = b;
        int64_t p = last_le(asc, n, g - asc[s1].cost);
        if (p > e_s - 1) p = e_s - 1;
        p = find_left(&sk, p); /* >= s2 > s1: s2 is untaken and fits */
        take(&sk, p);
        load[b] += asc[p].cost;
        bin_of[asc[p].idx] = b;
    }
    /* (4) forward over all bins: while the smallest remaining item fits, add the largest that
     * fits */
    for (int64_t b = 0; b < n_large; b++) {
        for (;;) {
            const int64_t g = cap - load[b], lo = find_right(&sk, 0);
            if (lo >= n || asc[lo].cost > g) break;
            const int64_t p = find_left(&sk, last_le(asc, n, g));
            take(&sk, p);
            load[b] += asc[p].cost;
            bin_of[asc[p].idx] = b;
        }
    }
    /* (5) FFD for the rest, into new bins after the large ones */
    if (!tree_init(&ft, n > 0 ? n : 1, cap)) goto oom;
    for (int64_t b = 0; b < n_large; b++) tree_set(&ft, b, cap - load[b]);
    st = ffd_place(desc, n, &ft, cap, load, bin_of, n_bins);
    goto done;
oom:
    st = sph_err(SPH_ERR_ALLOC, "pack: out of host memory for %lld sequences", (long long)n);
done:
    sph_free(asc);
    sph_free(sk.left);
    sph_free(sk.right);
    sph_free(has_medium);
    sph_free(ft.t);
    return st;
}

// ---- heaps over bins keyed by (load, bin) -----------------------------------------------------

typedef struct bin_heap {
    int64_t *b;         /* bin ids */
    int64_t n;
    const int64_t *load;
    int max;            /* 1: fullest on top (ties lower bin), 0: least loaded (ties lower bin) */
} bin_heap;

static bool heap_before(const bin_heap *h, int64_t x, int64_t y) {
    if (h->load[x] != h->load[y]) return h->max ? h->load[x] > h->load[y] : h->load[x] < h->load[y];
    return x < y;
}

static void heap_push(bin_heap *h, int64_t bin) {
    int64_t i = h->n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!heap_before(h, bin, h->b[p])) break;
        h->b[i] = h->b[p];
        i = p;
    }
    h->b[i] = bin;
}

static int64_t heap_pop(bin_heap *h) {
    const int64_t top = h->b[0], last = h->b[--h->n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && heap_before(h, h->b[c + 1], h->b[c])) c++;
        if (!heap_before(h, h->b[c], last)) break;
        h->b[i] = h->b[c];
        i = c;
    }
    if (h->n > 0) h->b[i] = last;
    return top;
}

static sph_status target_bins(int64_t have, const sph_pack_opts *o, int64_t *target) {
    int64_t t = have > o->min_bins ? have : o->min_bins, r = 0;
    const int64_t d = o->bin_multiple > 1 ? o->bin_multiple : 1;
    if (sph_round_up(t, d, &r) != SPH_OK)
        return sph_err(SPH_ERR_OVERFLOW, "pack: bin count %lld rounded to bin_multiple %lld "
                       "overflows int64", (long long)t, (long long)d);
    *target = r;
    return SPH_OK;
}

static sph_status balanced(const item *desc, int64_t n, int64_t cap, int64_t sum_normal,
                           const sph_pack_opts *o, int64_t *load, int64_t *bin_of,
                           int64_t *n_bins) {
    int64_t n_over = 0;
    while (n_over < n && desc[n_over].cost > cap) {
        load[n_over] = desc[n_over].cost;
        bin_of[desc[n_over].idx] = n_over;
        n_over++;
    }
    const int64_t n_normal = n - n_over;
    int64_t k0 = sum_normal / cap + (sum_normal % cap != 0), t = 0;
    SPH_TRY(target_bins(k0 + n_over, o, &t));
    k0 = t - n_over;
    if (k0 > n_normal) k0 = n_normal; /* more bins than items: the adjustment reports it */
    bin_heap h = {sph_malloc(sizeof(int64_t) * (size_t)(n + 1)), 0, load, 0};
    if (!h.b) return sph_err(SPH_ERR_ALLOC, "pack: out of host memory");
    int64_t nb = n_over + k0;
    for (int64_t b = n_over; b < nb; b++) {
        load[b] = 0;
        heap_push(&h, b);
    }
    for (int64_t i = n_over; i < n; i++) {
        const int64_t c = desc[i].cost;
        int64_t b = h.n ? h.b[0] : -1;
        if (b >= 0 && load[b] + c <= cap) {
            heap_pop(&h);
        } else {
            b = nb++; /* least loaded cannot take it: none can */
            load[b] = 0;
        }
        load[b] += c;
        bin_of[desc[i].idx] = b;
        heap_push(&h, b);
    }
    sph_free(h.b);
    *n_bins = nb;
    return SPH_OK;
}

// ---- bin-count adjustment and output ---------------------------------------------------------

static sph_status adjust_and_emit(const item *desc, int64_t n, int64_t nb, int64_t target,
                                  int64_t *load, int64_t *bin_of, int64_t capacity,
                                  int64_t sum, sph_pack_result **out) {
    sph_status st = SPH_OK;
    int64_t *start = sph_calloc((size_t)target + 2, sizeof(int64_t));
    int64_t *head = sph_malloc(sizeof(int64_t) * (size_t)(target + 1));
    int64_t *list = sph_malloc(sizeof(int64_t) * (size_t)(n + 1)); /* positions into desc */
    bin_heap h = {sph_malloc(sizeof(int64_t) * (size_t)(target + 1)), 0, load, 1};
    sph_pack_result *r = sph_calloc(1, sizeof *r);
    if (!start || !head || !list || !h.b || !r) goto oom;
    if (target > nb) {
        /* per-bin item lists in decreasing cost order (stable counting sort of desc by bin) */
        for (int64_t i = 0; i < n; i++) start[bin_of[desc[i].idx] + 1]++;
        for (int64_t b = 0; b < nb; b++) start[b + 1] += start[b];
        for (int64_t b = 0; b < nb; b++) head[b] = start[b];
        for (int64_t i = 0; i < n; i++) list[head[bin_of[desc[i].idx]]++] = i;
        for (int64_t b = 0; b < nb; b++) head[b] = start[b];
        for (int64_t b = 0; b < nb; b++)
            if (start[b + 1] - head[b] >= 2) heap_push(&h, b);
        for (int64_t m = nb; m < target; m++) {
            if (!h.n) {
                st = sph_err(SPH_ERR_INTERNAL, "pack: no bin with two items to split");
                goto done;
            }
            const int64_t b = heap_pop(&h), it = list[head[b]++];
            load[b] -= desc[it].cost;
            load[m] = desc[it].cost;
            bin_of[desc[it].idx] = m;
            if (start[b + 1] - head[b] >= 2) heap_push(&h, b);
        }
        nb = target;
    }
    /* output: bins in order, each bin's items by increasing index */
    r->n_bins = nb;
    r->n_items = n;
    r->bin_offsets = sph_calloc((size_t)nb + 2, sizeof(int64_t));
    r->items = sph_malloc(sizeof(int64_t) * (size_t)(n + 1));
    r->bin_tokens = sph_malloc(sizeof(int64_t) * (size_t)(nb + 1));
    if (!r->bin_offsets || !r->items || !r->bin_tokens) goto oom;
    for (int64_t i = 0; i < n; i++) r->bin_offsets[bin_of[i] + 1]++;
    for (int64_t b = 0; b < nb; b++) r->bin_offsets[b + 1] += r->bin_offsets[b];
    for (int64_t b = 0; b <= nb; b++) head[b] = r->bin_offsets[b];
    for (int64_t i = 0; i < n; i++) r->items[head[bin_of[i]]++] = i;
    for (int64_t b = 0; b < nb; b++) {
        r->bin_tokens[b] = load[b];
        if (r->bin_offsets[b + 1] == r->bin_offsets[b]) {
            st = sph_err(SPH_ERR_INTERNAL, "pack: bin %lld is empty", (long long)b);
            goto done;
        }
    }
    r->utilization = nb ? (double)sum / ((double)nb * (double)capacity) : 0.0;
    *out = r;
    r = NULL;
    goto done;
oom:
    st = sph_err(SPH_ERR_ALLOC, "pack: out of host memory for %lld sequences", (long long)n);
done:
    sph_pack_free(r);
    sph_free(start);
    sph_free(head);
    sph_free(list);
    sph_free(h.b);
    return st;
}

void sph_pack_free(sph_pack_result *r) {
    if (!r) return;
    sph_free(r->bin_offsets);
    sph_free(r->items);
    sph_free(r->bin_tokens);
    sph_free(r);
}

sph_status sph_pack(const int64_t *lengths, int64_t n, const sph_pack_opts *opts,
                    sph_pack_result **out) {
    SPH_CHECK(out, SPH_ERR_INVALID_ARG, "out: is NULL");
    *out = NULL;
    SPH_CHECK(opts, SPH_ERR_INVALID_ARG, "opts: is NULL (use SPH_PACK_OPTS_INIT)");
    SPH_CHECK(opts->struct_size >= sizeof(sph_pack_opts), SPH_ERR_INVALID_ARG,
              "opts.struct_size: %zu, expected %zu (use SPH_PACK_OPTS_INIT)", opts->struct_size,
              sizeof(sph_pack_opts));
    SPH_CHECK(opts->capacity > 0, SPH_ERR_INVALID_ARG, "opts.capacity: %lld, expected > 0",
              (long long)opts->capacity);
    SPH_CHECK(opts->algorithm == SPH_PACK_FFD || opts->algorithm == SPH_PACK_MFFD ||
                  opts->algorithm == SPH_PACK_BALANCED,
              SPH_ERR_INVALID_ARG, "opts.algorithm: %d, expected SPH_PACK_FFD, _MFFD or _BALANCED",
              (int)opts->algorithm);
    SPH_CHECK(opts->min_bins >= 0, SPH_ERR_INVALID_ARG, "opts.min_bins: %lld, expected >= 0",
              (long long)opts->min_bins);
    SPH_CHECK(opts->bin_multiple >= 0, SPH_ERR_INVALID_ARG,
              "opts.bin_multiple: %lld, expected >= 0 (0 or 1 = any)",
              (long long)opts->bin_multiple);
    SPH_CHECK(n >= 0, SPH_ERR_INVALID_ARG, "n: %lld, expected >= 0", (long long)n);
    SPH_CHECK(n == 0 || lengths, SPH_ERR_INVALID_ARG, "lengths: is NULL with n = %lld",
              (long long)n);
    sph_alignment al;
    SPH_TRY(sph_alignment_get(&opts->par, &al));
    const int64_t cap = opts->capacity / al.total * al.total;
    SPH_CHECK(cap > 0, SPH_ERR_INVALID_ARG,
              "opts.capacity: %lld is below the total alignment %lld of tp=%lld cp=%lld",
              (long long)opts->capacity, (long long)al.total, (long long)opts->par.tp,
              (long long)opts->par.cp);
    SPH_CHECK((uint64_t)n < SIZE_MAX / (4 * sizeof(item)), SPH_ERR_OVERFLOW,
              "n: %lld sequences overflow the host address space", (long long)n);
    const bool soft = opts->algorithm == SPH_PACK_BALANCED;

    item *desc = sph_malloc(sizeof(item) * (size_t)(n + 1));
    int64_t *load = sph_malloc(sizeof(int64_t) * (size_t)(n + 1));
    int64_t *bin_of = sph_malloc(sizeof(int64_t) * (size_t)(n + 1));
    fit_tree ft = {NULL, 0};
    sph_status st = SPH_OK;
    if (!desc || !load || !bin_of) {
        st = sph_err(SPH_ERR_ALLOC, "pack: out of host memory for %lld sequences", (long long)n);
        goto done;
    }
    int64_t sum = 0, sum_normal = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t c;
        if (lengths[i] < 1) {
            st = sph_err(SPH_ERR_INVALID_ARG, "lengths[%lld]: %lld, expected >= 1", (long long)i,
                         (long long)lengths[i]);
            goto done;
        }
        if (sph_round_up(lengths[i], al.sequence, &c) != SPH_OK || !sph_add_i64(sum, c, &sum)) {
            st = sph_err(SPH_ERR_OVERFLOW, "lengths: padded sum overflows int64 at lengths[%lld]"
                         " = %lld", (long long)i, (long long)lengths[i]);
            goto done;
        }
        if (c > cap && !soft) {
            st = sph_err(SPH_ERR_INVALID_ARG,
                         "lengths[%lld]: %lld (padded %lld) exceeds the bin capacity %lld",
                         (long long)i, (long long)lengths[i], (long long)c, (long long)cap);
            goto done;
        }
        if (c <= cap) sum_normal += c;
        desc[i].cost = c;
        desc[i].idx = i;
        bin_of[i] = -1;
        load[i] = 0;
    }
    qsort(desc, (size_t)n, sizeof(item), cmp_desc);
    int64_t nb = 0, target = 0;
    if (opts->algorithm == SPH_PACK_FFD) {
        if (!tree_init(&ft, n > 0 ? n : 1, cap)) {
            st = sph_err(SPH_ERR_ALLOC, "pack: out of host memory for %lld sequences",
                         (long long)n);
            goto done;
        }
        st = ffd_place(desc, n, &ft, cap, load, bin_of, &nb);
    } else if (opts->algorithm == SPH_PACK_MFFD) {
        st = mffd(desc, n, cap, load, bin_of, &nb);
    } else {
        st = balanced(desc, n, cap, sum_normal, opts, load, bin_of, &nb);
    }
    if (st != SPH_OK) goto done;
    st = target_bins(nb, opts, &target);
    if (st != SPH_OK) goto done;
    if (target > n) {
        st = sph_err(SPH_ERR_INFEASIBLE,
                     "pack: %lld non-empty bins needed (min_bins = %lld, bin_multiple = %lld) "
                     "but only %lld sequences", (long long)target, (long long)opts->min_bins,
                     (long long)opts->bin_multiple, (long long)n);
        goto done;
    }
    st = adjust_and_emit(desc, n, nb, target, load, bin_of, opts->capacity, sum, out);
done:
    sph_free(desc);
    sph_free(load);
    sph_free(bin_of);
    sph_free(ft.t);
    return st;
}
