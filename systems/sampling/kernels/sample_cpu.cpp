// Uniform neighbour sampling on the CPU: the same draws as sample.cu (same hash, same Floyd
// steps), plus the relabelling of one hop into a batch's local ids, for NeighborSampler.
// Single-threaded by design: parallelism comes from sampling several batches in worker
// processes, as DGL's and PyG's loaders do.

#include <algorithm>
#include <cstdint>

typedef std::uint64_t u64;
typedef std::int64_t i64;

static inline u64 mix64(u64 x) {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static inline u64 draw(u64 rng_seed, i64 node, i64 counter) {
    return mix64(mix64(rng_seed ^ mix64((u64)node)) + (u64)counter);
}

static inline i64 sample_count(i64 degree, int fanout, int replace) {
    if (replace) return degree > 0 ? fanout : 0;
    return degree < fanout ? degree : fanout;
}

// A CSR that does not hold together: the kernels stop and return this instead of reading or
// writing out of bounds (a corrupt file must give an error, not a crash).
static const i64 BAD_CSR = -1;

struct Csr {
    const i64* indptr;
    const i64* indices;
    i64 num_nodes, num_indices;
};

// Neighbours of one node into dst; returns how many, or BAD_CSR.
static i64 sample_one(const Csr& g, i64 node, int fanout, int replace, u64 rng_seed, i64* dst) {
    const i64* indices = g.indices;
    if (node < 0 || node >= g.num_nodes) return BAD_CSR;
    const i64 start = g.indptr[node], degree = g.indptr[node + 1] - start;
    if (start < 0 || degree < 0 || start + degree > g.num_indices) return BAD_CSR;
    const i64 count = sample_count(degree, fanout, replace);
    if (replace) {
        for (i64 s = 0; s < count; ++s) dst[s] = indices[start + (i64)(draw(rng_seed, node, s) % (u64)degree)];
    } else if (degree <= fanout) {
        for (i64 s = 0; s < degree; ++s) dst[s] = indices[start + s];
    } else {
        i64 chosen[64];
        int picked = 0;
        for (i64 j = degree - fanout; j < degree; ++j) {  // Floyd: fanout distinct positions
            i64 t = (i64)(draw(rng_seed, node, j) % (u64)(j + 1));
            for (int c = 0; c < picked; ++c) {
                if (chosen[c] == t) { t = j; break; }
            }
            chosen[picked++] = t;
        }
        for (int c = 0; c < fanout; ++c) dst[c] = indices[start + chosen[c]];
    }
    return count;
}

extern "C" {

// sampling::sample_neighbors on the CPU. counts[i] neighbours of seeds[i], one seed after
// another in out (which holds num_seeds * fanout). Returns the number written, or BAD_CSR if a
// seed or a row of the CSR is out of range, or a neighbour id is not a node.
i64 sample_neighbors(const i64* indptr, const i64* indices, i64 num_nodes, i64 num_indices, const i64* seeds,
                     i64 num_seeds, int fanout, int replace, u64 rng_seed, i64* counts, i64* out) {
    const Csr g{indptr, indices, num_nodes, num_indices};
    i64 total = 0;
    for (i64 i = 0; i < num_seeds; ++i) {
        const i64 count = sample_one(g, seeds[i], fanout, replace, rng_seed, out + total);
        if (count == BAD_CSR) return BAD_CSR;
        for (i64 k = total; k < total + count; ++k) {
            if (out[k] < 0 || out[k] >= num_nodes) return BAD_CSR;
        }
        counts[i] = count;
        total += count;
    }
    return total;
}

// One hop of NeighborSampler: samples the frontier's neighbours and relabels them.
// position[v] is v's local id in the batch, or -1; the hop's new nodes get the next local ids
// (from `next_id`) in ascending global-id order, as torch.unique orders them on the GPU path.
// Writes counts (num_frontier), and per sampled edge its neighbour's global id (neighbors),
// its neighbour's local id (sources) and its frontier node's local id (targets); the new nodes
// go to new_nodes and their number to *num_new. Buffers hold num_frontier * fanout entries.
// Returns the number of sampled edges, or BAD_CSR (position is then left as it was).
i64 sample_hop(const i64* indptr, const i64* indices, i64 num_nodes, i64 num_indices, const i64* frontier,
               i64 num_frontier, int fanout, int replace, u64 rng_seed, i64* position, i64 next_id, i64* counts,
               i64* neighbors, i64* sources, i64* targets, i64* new_nodes, i64* num_new) {
    const i64 edges = sample_neighbors(indptr, indices, num_nodes, num_indices, frontier, num_frontier, fanout,
                                       replace, rng_seed, counts, neighbors);
    if (edges == BAD_CSR) return BAD_CSR;
    for (i64 i = 0, e = 0; i < num_frontier; ++i) {
        const i64 local = position[frontier[i]];
        for (i64 c = 0; c < counts[i]; ++c) targets[e++] = local;
    }
    i64 fresh = 0;
    for (i64 e = 0; e < edges; ++e) {
        const i64 v = neighbors[e];
        if (position[v] == -1) {
            position[v] = -2;  // seen in this hop; numbered below
            new_nodes[fresh++] = v;
        }
    }
    std::sort(new_nodes, new_nodes + fresh);
    for (i64 k = 0; k < fresh; ++k) position[new_nodes[k]] = next_id + k;
    for (i64 e = 0; e < edges; ++e) sources[e] = position[neighbors[e]];
    *num_new = fresh;
    return edges;
}

// Forget a batch: position[ids[k]] = -1.
void reset_positions(i64* position, const i64* ids, i64 count) {
    for (i64 k = 0; k < count; ++k) position[ids[k]] = -1;
}

}  // extern "C"
