// Top-k / top-p sampling at a temperature, on the GPU, seeded: the drawn id is written to
// Ids[pos + n_batch] like argmax's, so sampling needs no read-back either.
// 1. The k largest logits, in order (value descending, lower index first on a tie): k passes, each
//    a reduction over the vocabulary for the largest logit ranked below the previous pick.
// 2. Thread 0: softmax of the picks / temperature, cut to the smallest prefix whose mass reaches
//    top_p (at least one), and the pick where the cumulative mass passes u * kept mass, with u a
//    uniform draw from a hash of (seed, position): the same seed gives the same text.
// EMBED: the drawn id's embedding row is written as the next step's input too (see argmax.wgsl).

const MAX_K: u32 = 64u;

struct Params {
    n: u32,
    offset: u32,
    e_cols: u32,
    e_row_bytes: u32,
    e_units: u32,
    e_rows: u32,
}

struct Sampling {
    top_k: u32,
    seed: u32,
    temperature: f32,
    top_p: f32,
}

@group(0) @binding(0) var<storage, read> L: array<f32>;
@group(0) @binding(1) var<storage, read_write> Ids: array<u32>;
@group(0) @binding(2) var<uniform> P: Params;
@group(0) @binding(3) var<storage, read> S: array<u32>;
@group(0) @binding(4) var<storage, read> Q: Sampling;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> top_v: array<f32, MAX_K>;
var<workgroup> top_i: array<u32, MAX_K>;
// The drawn id, for every thread's share of the EMBED row.
var<workgroup> chosen: u32;

// Whether (v, i) ranks before (w, j): larger value, or the same value and a lower index.
fn before(v: f32, i: u32, w: f32, j: u32) -> bool {
    return j == 0xffffffffu || (i != 0xffffffffu && (v > w || (v == w && i < j)));
}

// PCG-style hash to a float in [0, 1).
fn uniform01(a: u32, b: u32) -> f32 {
    var x = a * 747796405u + b * 2891336453u + 277803737u;
    x = ((x >> ((x >> 28u) + 4u)) ^ x) * 277803737u;
    x = (x >> 22u) ^ x;
    x = x * 747796405u + 2891336453u;
    x = ((x >> ((x >> 28u) + 4u)) ^ x) * 277803737u;
    x = (x >> 22u) ^ x;
    return f32(x >> 8u) / 16777216.0;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    let k = clamp(Q.top_k, 1u, min(MAX_K, P.n));
    var prev_v = 3.4e38;
    var prev_i = 0xffffffffu;
    for (var r = 0u; r < k; r++) {
        var bv = 0.0;
        var bi = 0xffffffffu;
        for (var i = lid; i < P.n; i += WG) {
            let v = L[P.offset + i];
            // Ranked strictly after the previous pick, and before this thread's best so far.
            let after_prev = prev_i == 0xffffffffu || v < prev_v || (v == prev_v && i > prev_i);
            if (after_prev && before(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        best_v[lid] = bv;
        best_i[lid] = bi;
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (lid < s && before(best_v[lid + s], best_i[lid + s], best_v[lid], best_i[lid])) {
                best_v[lid] = best_v[lid + s];
                best_i[lid] = best_i[lid + s];
            }
            workgroupBarrier();
        }
        prev_v = best_v[0];
        prev_i = best_i[0];
        if (lid == 0u) {
            top_v[r] = prev_v;
            top_i[r] = prev_i;
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let step = S[0] + S[1];
        var total = 0.0;
        var kept = k;
        // The picks are in descending order, so exp((v - top) / T) <= 1 and the first is 1.
        var mass: array<f32, MAX_K>;
        for (var r = 0u; r < k; r++) {
            mass[r] = exp((top_v[r] - top_v[0]) / Q.temperature);
            total += mass[r];
        }
        var cum = 0.0;
        for (var r = 0u; r < k; r++) {
            cum += mass[r] / total;
            if (cum >= Q.top_p) {
                kept = r + 1u;
                break;
            }
        }
        var kept_mass = 0.0;
        for (var r = 0u; r < kept; r++) {
            kept_mass += mass[r];
        }
        let goal = uniform01(Q.seed, step) * kept_mass;
        var pick = top_i[kept - 1u];
        var run = 0.0;
        for (var r = 0u; r < kept; r++) {
            run += mass[r];
            if (goal < run) {
                pick = top_i[r];
                break;
            }
        }
        Ids[step] = pick;
        chosen = pick;
    }
    workgroupBarrier();
    if (EMBED) {
        embed_row(chosen, lid);
    }
}
