/* ---- top-k in torch's order (codegen/c/emit_routing.py) -------------------------------------
   torch's CPU topk (ATen/native/TopKImpl.h) orders (value, index) pairs with
   std::partial_sort when k * 64 <= n, else std::nth_element then std::sort of the first k - 1;
   its comparator puts NaN first (largest) or last (smallest). Equal values are left in
   whatever order those algorithms leave them, and a router fed equal scores (a zero-initialised
   gate) picks its experts by that order: to give eager's answer the same algorithms are
   followed here step by step, as GNU libstdc++ implements them (bits/stl_algo.h, stl_heap.h:
   introselect, median-of-three partitions, insertion sorts of 16, binary heaps). tests/
   test_moe.py compares the result with torch.topk on inputs full of ties. */

/* a before b: the greater (largest) or the smaller value, NaN counting as the extreme */
static inline int eq_before(const eq_pair* a, const eq_pair* b, int largest) {
    if (largest) return (isnan(a->v) && !isnan(b->v)) || a->v > b->v;
    return (!isnan(a->v) && isnan(b->v)) || a->v < b->v;
}

static inline void eq_pswap(eq_pair* a, eq_pair* b) { eq_pair t = *a; *a = *b; *b = t; }

static inline int64_t eq_lg(int64_t n) { return 63 - __builtin_clzll((unsigned long long)n); }

static void eq_push_heap(eq_pair* f, int64_t hole, int64_t top, eq_pair value, int largest) {
    int64_t parent = (hole - 1) / 2;
    while (hole > top && eq_before(f + parent, &value, largest)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = value;
}

static void eq_adjust_heap(eq_pair* f, int64_t hole, int64_t len, eq_pair value, int largest) {
    const int64_t top = hole;
    int64_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (eq_before(f + child, f + (child - 1), largest)) child--;
        f[hole] = f[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        f[hole] = f[child - 1];
        hole = child - 1;
    }
    eq_push_heap(f, hole, top, value, largest);
}

static void eq_make_heap(eq_pair* f, int64_t len, int largest) {
    if (len < 2) return;
    for (int64_t parent = (len - 2) / 2;; parent--) {
        eq_adjust_heap(f, parent, len, f[parent], largest);
        if (parent == 0) return;
    }
}

static inline void eq_pop_heap(eq_pair* f, int64_t len, eq_pair* result, int largest) {
    eq_pair value = *result;
    *result = f[0];
    eq_adjust_heap(f, 0, len, value, largest);
}

static void eq_heap_select(eq_pair* f, int64_t middle, int64_t last, int largest) {
    eq_make_heap(f, middle, largest);
    for (int64_t i = middle; i < last; i++)
        if (eq_before(f + i, f, largest)) eq_pop_heap(f, middle, f + i, largest);
}

static void eq_partial_sort(eq_pair* f, int64_t middle, int64_t last, int largest) {
    eq_heap_select(f, middle, last, largest);
    for (int64_t end = middle; end > 1;) {
        end--;
        eq_pop_heap(f, end, f + end, largest);
    }
}

static inline void eq_unguarded_linear_insert(eq_pair* last, int largest) {
    eq_pair value = *last;
    eq_pair* next = last - 1;
    while (eq_before(&value, next, largest)) {
        *last = *next;
        last = next;
        next--;
    }
    *last = value;
}

static void eq_insertion_sort(eq_pair* first, eq_pair* last, int largest) {
    if (first == last) return;
    for (eq_pair* i = first + 1; i != last; i++) {
        if (eq_before(i, first, largest)) {
            eq_pair value = *i;
            memmove(first + 1, first, (size_t)(i - first) * sizeof(eq_pair));
            *first = value;
        } else {
            eq_unguarded_linear_insert(i, largest);
        }
    }
}

static void eq_move_median_to_first(eq_pair* result, eq_pair* a, eq_pair* b, eq_pair* c,
                                    int largest) {
    if (eq_before(a, b, largest)) {
        if (eq_before(b, c, largest)) eq_pswap(result, b);
        else if (eq_before(a, c, largest)) eq_pswap(result, c);
        else eq_pswap(result, a);
    } else if (eq_before(a, c, largest)) eq_pswap(result, a);
    else if (eq_before(b, c, largest)) eq_pswap(result, c);
    else eq_pswap(result, b);
}

static eq_pair* eq_unguarded_partition(eq_pair* first, eq_pair* last, eq_pair* pivot,
                                       int largest) {
    for (;;) {
        while (eq_before(first, pivot, largest)) first++;
        last--;
        while (eq_before(pivot, last, largest)) last--;
        if (!(first < last)) return first;
        eq_pswap(first, last);
        first++;
    }
}

static inline eq_pair* eq_partition_pivot(eq_pair* first, eq_pair* last, int largest) {
    eq_pair* mid = first + (last - first) / 2;
    eq_move_median_to_first(first, first + 1, mid, last - 1, largest);
    return eq_unguarded_partition(first + 1, last, first, largest);
}

static void eq_nth_element(eq_pair* first, eq_pair* nth, eq_pair* last, int largest) {
    if (first == last || nth == last) return;
    int64_t depth = eq_lg(last - first) * 2;
    while (last - first > 3) {
        if (depth == 0) {
            eq_heap_select(first, nth + 1 - first, last - first, largest);
            eq_pswap(first, nth);
            return;
        }
        depth--;
        eq_pair* cut = eq_partition_pivot(first, last, largest);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    eq_insertion_sort(first, last, largest);
}

static void eq_introsort_loop(eq_pair* first, eq_pair* last, int64_t depth, int largest) {
    while (last - first > 16) {
        if (depth == 0) {
            eq_partial_sort(first, last - first, last - first, largest);
            return;
        }
        depth--;
        eq_pair* cut = eq_partition_pivot(first, last, largest);
        eq_introsort_loop(cut, last, depth, largest);
        last = cut;
    }
}

static void eq_sort(eq_pair* first, eq_pair* last, int largest) {
    if (first == last) return;
    eq_introsort_loop(first, last, eq_lg(last - first) * 2, largest);
    if (last - first > 16) {
        eq_insertion_sort(first, first + 16, largest);
        for (eq_pair* i = first + 16; i != last; i++) eq_unguarded_linear_insert(i, largest);
    } else {
        eq_insertion_sort(first, last, largest);
    }
}

/* the first k of q[0..n) in torch.topk's order (sorted) */
EQ_ENTRY void eq_topk(eq_pair* q, int64_t n, int64_t k, int largest) {
    if (k == 0) return;
    if (k * 64 <= n) {
        eq_partial_sort(q, k, n, largest);
    } else {
        eq_nth_element(q, q + k - 1, q + n, largest);
        eq_sort(q, q + k - 1, largest);
    }
}
