// Causal attention of one query head of one token over the KV cache: token b at position
// pos = S[0] + b sees keys 0..pos. Scores go to a scratch row (a thread per key, q held in workgroup
// memory), then softmax, then the weighted sum of V (the caches hold kv_t: f16 or f32, see
// rope_store.wgsl). Query head h reads KV head h / (n_head / n_kv) (grouped-query attention).
// The weighted sum splits the keys among G groups of TD threads (TD dims at a time, the groups
// summed in workgroup memory), so each thread's chain of dependent loads is n / G long, not n.
// SPLIT splits the keys along the sequence as attention_vec4.wgsl does (partial_out, then
// attention_combine.wgsl).

struct Params {
    n_head: u32,
    n_kv: u32,
    head_dim: u32,
    qkv_stride: u32,
    kv_dim: u32,
    ctx: u32,
    out_stride: u32,
    scale: f32,
    // Used by attention_vec4's rotary variant only (the host writes one layout for both kernels).
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
@group(0) @binding(1) var<storage, read> Kc: array<kv_t>;
@group(0) @binding(2) var<storage, read> Vc: array<kv_t>;
@group(0) @binding(3) var<storage, read_write> Out: array<f32>;
@group(0) @binding(4) var<storage, read_write> Sc: array<f32>;
@group(0) @binding(5) var<uniform> P: Params;
@group(0) @binding(6) var<storage, read> S: array<u32>;

const TD: u32 = 32u;
const G: u32 = WG / TD;
const MAX_HEAD_DIM: u32 = 512u;

var<workgroup> red: array<f32, WG>;
var<workgroup> qs: array<f32, MAX_HEAD_DIM>;

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
    let hd = P.head_dim;
    let kvh = h / (P.n_head / P.n_kv);
    let qo = b * P.qkv_stride + h * P.q_stride;
    let ko = kvh * hd;
    let so = (b * P.n_head + h) * P.ctx;
    for (var d = lid; d < hd; d += WG) {
        qs[d] = QKV[qo + d];
    }
    workgroupBarrier();
    var m = -3.4e38;
    for (var j = j0 + lid; j < j1; j += WG) {
        var s = 0.0;
        let kj = kv_row(j) * P.kv_dim + ko;
        for (var d = 0u; d < hd; d++) {
            s += qs[d] * f32(Kc[kj + d]);
        }
        s *= P.scale;
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
    for (var d0 = 0u; d0 < hd; d0 += TD) {
        let d = d0 + l;
        var acc = 0.0;
        if (d < hd) {
            for (var j = j0 + g; j < j1; j += G) {
                acc += Sc[so + j] * f32(Vc[kv_row(j) * P.kv_dim + ko + d]);
            }
        }
        red[lid] = acc;
        workgroupBarrier();
        if (g == 0u && d < hd) {
            var total_d = 0.0;
            for (var k = 0u; k < G; k++) {
                total_d += red[k * TD + l];
            }
            if (SPLIT) {
                partial_out(partial_base(b, h, wid.z) + 2u + d, total_d);
            } else {
                Out[b * P.out_stride + h * hd + d] = total_d / sum * out_gate(qo, d);
            }
        }
        workgroupBarrier();
    }
}
