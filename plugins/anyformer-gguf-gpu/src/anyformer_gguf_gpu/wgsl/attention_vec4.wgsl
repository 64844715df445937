// attention.wgsl for heads whose width is a multiple of 4: the same causal attention of one query
// head of one token over the KV cache, reading the caches 4 values (one vec4) at a time.
// Scores: a thread per key, q held in workgroup memory as vec4s. Weighted sum of V: TD threads
// cover 4 * TD dims of the head (4 each), G = WG / TD groups split the keys, and the groups are
// summed in workgroup memory: each thread's chain of dependent loads is n / G vec4s long.
// ROPE (a constant, for models whose rotary is not in the q/k/v projection: NEOX, q/k norms) makes
// this kernel do rope_store's work for its heads first: it norms and rotates its q head and its KV
// head's current k (rope_head, prepended by the host with its bindings), uses them for the token's
// own position, and the first q head of each KV group stores that k and v into the caches. The
// keys of the step's earlier tokens (positions S[0].. before its own) are read from the q/k/v rows,
// normed and rotated on the fly (step_key_dot), never from the cache, which other workgroups of the
// same dispatch are writing: no workgroup waits for another's store, in prefill steps too.
// SPLIT (a constant) splits the keys along the sequence (flash-decoding): workgroup (h, b, c) takes
// keys c*CHUNK.. of its head and writes its chunk's max score, sum of exponentials and unnormalised
// weighted sum of V to the scratch after the scores (partial_out); attention_combine.wgsl merges the
// chunks. Chunks past the token's position have no keys and return at once. Without SPLIT, CHUNK
// covers every key and the one workgroup per head writes the output.
// A ring (P.ring above 0, a sliding-window layer's cache) keeps position j at row j % ring (kv_row).

struct Params {
    n_head: u32,
    n_kv: u32,
    head_dim: u32,
    qkv_stride: u32,
    kv_dim: u32,
    ctx: u32,
    out_stride: u32,
    scale: f32,
    n_rot: u32,
    neox: u32,
    has_norm: u32,
    eps: f32,
    norm_k_off: u32,
    k_off: u32,
    v_off: u32,
    part_off: u32,
    // Sliding-window attention: a token sees its last window keys (0: every key before it).
    window: u32,
    // Where head h's query starts (h * q_stride: head_dim, or 2 head_dim where each query is followed by
    // its output gate), and whether the output is scaled by sigmoid(gate) (qwen35moe's gated attention).
    q_stride: u32,
    gated: u32,
    // Rows in the KV cache (0: one per position, the cache as long as the context). Above 0 the cache is a
    // ring (a sliding-window layer's): position j's keys and values sit at row j % ring.
    ring: u32,
}

@group(0) @binding(0) var<storage, read> QKV: array<f32>;
@group(0) @binding(1) var<storage, read_write> Kc: array<vec4<kv_t>>;
@group(0) @binding(2) var<storage, read_write> Vc: array<vec4<kv_t>>;
@group(0) @binding(3) var<storage, read_write> Out: array<f32>;
@group(0) @binding(4) var<storage, read_write> Sc: array<f32>;
@group(0) @binding(5) var<uniform> P: Params;
@group(0) @binding(6) var<storage, read> S: array<u32>;

const TD: u32 = 16u;
const G: u32 = WG / TD;
const MAX_HEAD_DIM: u32 = 512u;

var<workgroup> red: array<f32, WG>;
var<workgroup> red4: array<vec4<f32>, WG>;
var<workgroup> qs: array<vec4<f32>, MAX_HEAD_DIM / 4u>;
// The current position's rotated k and its v (the ROPE variant).
var<workgroup> kcur: array<vec4<f32>, MAX_HEAD_DIM / 4u>;
var<workgroup> vcur: array<vec4<f32>, MAX_HEAD_DIM / 4u>;

fn reduce_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let out = red[0];
    workgroupBarrier();
    return out;
}

fn reduce_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    let out = red[0];
    workgroupBarrier();
    return out;
}

// The cache row of position j (see Params.ring).
fn kv_row(j: u32) -> u32 {
    if (P.ring == 0u) {
        return j;
    }
    return j % P.ring;
}

// sigmoid of the output gate beside query head h's values (1 where the attention is not gated).
fn out_gate(qo: u32, d: u32) -> f32 {
    if (P.gated == 0u) {
        return 1.0;
    }
    return 1.0 / (1.0 + exp(-QKV[qo + P.head_dim + d]));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let b = wid.y;
    let n = S[0] + b + 1u;
    // This workgroup's keys: j0..j1 (all of them without SPLIT).
    let c0 = wid.z * CHUNK;
    if (c0 >= n) {
        return;
    }
    let j1 = min(n, c0 + CHUNK);
    // Keys before the window are not seen: a chunk wholly before it leaves an empty partial (max
    // -3.4e38, sum 0), which the combine weights by 0.
    let j0 = max(c0, select(0u, n - P.window, P.window != 0u && n > P.window));
    let hd4 = P.head_dim / 4u;
    let kv4 = P.kv_dim / 4u;
    let kvh = h / (P.n_head / P.n_kv);
    let qo = b * P.qkv_stride + h * P.q_stride;
    let ko4 = kvh * hd4;
    let so = (b * P.n_head + h) * P.ctx;
    let pos = S[0] + b;
    if (ROPE) {
        rope_head(qo, 0u, pos, lid);
        for (var d4 = lid; d4 < hd4; d4 += WG) {
            qs[d4] = vec4<f32>(cur[4u * d4], cur[4u * d4 + 1u], cur[4u * d4 + 2u], cur[4u * d4 + 3u]);
        }
        workgroupBarrier();
        rope_head(b * P.qkv_stride + P.k_off + kvh * P.head_dim, P.norm_k_off, pos, lid);
        let vo = b * P.qkv_stride + P.v_off + kvh * P.head_dim;
        for (var d4 = lid; d4 < hd4; d4 += WG) {
            kcur[d4] = vec4<f32>(cur[4u * d4], cur[4u * d4 + 1u], cur[4u * d4 + 2u], cur[4u * d4 + 3u]);
            let v = vo + 4u * d4;
            vcur[d4] = vec4<f32>(QKV[v], QKV[v + 1u], QKV[v + 2u], QKV[v + 3u]);
            if (h % (P.n_head / P.n_kv) == 0u && j1 == n) {
                Kc[kv_row(pos) * kv4 + ko4 + d4] = vec4<kv_t>(kcur[d4]);
                Vc[kv_row(pos) * kv4 + ko4 + d4] = vec4<kv_t>(vcur[d4]);
            }
        }
    } else {
        for (var d4 = lid; d4 < hd4; d4 += WG) {
            let q = qo + 4u * d4;
            qs[d4] = vec4<f32>(QKV[q], QKV[q + 1u], QKV[q + 2u], QKV[q + 3u]);
        }
    }
    workgroupBarrier();
    var m = -3.4e38;
    for (var j = j0 + lid; j < j1; j += WG) {
        var s4 = vec4<f32>(0.0);
        let kj = kv_row(j) * kv4 + ko4;
        if (ROPE && j == pos) {
            for (var d4 = 0u; d4 < hd4; d4++) {
                s4 += qs[d4] * kcur[d4];
            }
        } else if (ROPE && j >= S[0]) {
            s4.x = step_key_dot((j - S[0]) * P.qkv_stride + P.k_off + kvh * P.head_dim, j);
        } else {
            for (var d4 = 0u; d4 < hd4; d4++) {
                s4 += qs[d4] * vec4<f32>(Kc[kj + d4]);
            }
        }
        let s = (s4.x + s4.y + s4.z + s4.w) * P.scale;
        Sc[so + j] = s;
        m = max(m, s);
    }
    let mx = reduce_max(m, lid);
    var total = 0.0;
    for (var j = j0 + lid; j < j1; j += WG) {
        let p = exp(Sc[so + j] - mx);
        Sc[so + j] = p;
        total += p;
    }
    let sum = reduce_sum(total, lid);
    if (SPLIT && lid == 0u) {
        partial_out(partial_base(b, h, wid.z), mx);
        partial_out(partial_base(b, h, wid.z) + 1u, sum);
    }
    storageBarrier();
    workgroupBarrier();
    let l = lid % TD;
    let g = lid / TD;
    for (var base = 0u; base < hd4; base += TD) {
        let d4 = base + l;
        var acc = vec4<f32>(0.0);
        if (d4 < hd4) {
            for (var j = j0 + g; j < j1; j += G) {
                if (ROPE && j == pos) {
                    acc += Sc[so + j] * vcur[d4];
                } else if (ROPE && j >= S[0]) {
                    let v = (j - S[0]) * P.qkv_stride + P.v_off + kvh * P.head_dim + 4u * d4;
                    acc += Sc[so + j] * vec4<f32>(QKV[v], QKV[v + 1u], QKV[v + 2u], QKV[v + 3u]);
                } else {
                    acc += Sc[so + j] * vec4<f32>(Vc[kv_row(j) * kv4 + ko4 + d4]);
                }
            }
        }
        red4[lid] = acc;
        workgroupBarrier();
        if (g == 0u && d4 < hd4) {
            var t = vec4<f32>(0.0);
            for (var k = 0u; k < G; k++) {
                t += red4[k * TD + l];
            }
            if (SPLIT) {
                let pb = partial_base(b, h, wid.z) + 2u + 4u * d4;
                partial_out(pb, t.x);
                partial_out(pb + 1u, t.y);
                partial_out(pb + 2u, t.z);
                partial_out(pb + 3u, t.w);
            } else {
                let o = b * P.out_stride + h * P.head_dim + 4u * d4;
                let d = 4u * d4;
                Out[o] = t.x / sum * out_gate(qo, d);
                Out[o + 1u] = t.y / sum * out_gate(qo, d + 1u);
                Out[o + 2u] = t.z / sum * out_gate(qo, d + 2u);
                Out[o + 3u] = t.w / sum * out_gate(qo, d + 3u);
            }
        }
        workgroupBarrier();
    }
}
