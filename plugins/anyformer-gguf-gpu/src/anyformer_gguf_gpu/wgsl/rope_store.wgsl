// One workgroup per head of one token: the q heads are (optionally RMS-normed per head, qwen3's
// q_norm/k_norm, then) rotated in place; the k heads are normed and rotated into the K cache; the v
// heads are copied into the V cache. The rotation's cos/sin come from a table built on the CPU in
// float64 (CS[pos][i] = cos, sin of pos * base^(-2i/n_rot)), so no large-argument sin/cos on the GPU.
// The caches hold kv_t: f16 where the adapter has shader-f16 (half the memory and traffic), else f32.
// neox = 0 rotates pairs (2i, 2i+1) (llama), neox = 1 pairs (i, i + n_rot/2) (qwen3, lfm2).
// v_norm RMS-normalises each v head (no weight) before it is stored (Gemma 4).

struct Params {
    n_head: u32,
    n_kv: u32,
    head_dim: u32,
    n_rot: u32,
    qkv_stride: u32,
    k_off: u32,
    v_off: u32,
    kv_dim: u32,
    neox: u32,
    has_norm: u32,
    eps: f32,
    norm_k_off: u32,
    v_norm: u32,
    // Query head h starts at h * q_stride (head_dim, or 2 head_dim where each query is followed by its gate).
    q_stride: u32,
    // Rows in the KV cache (0: one per position). Above 0 a ring: position pos is stored at row pos % ring.
    ring: u32,
}

@group(0) @binding(0) var<storage, read_write> QKV: array<f32>;
@group(0) @binding(1) var<storage, read_write> Kc: array<kv_t>;
@group(0) @binding(2) var<storage, read_write> Vc: array<kv_t>;
@group(0) @binding(3) var<storage, read> CS: array<f32>;
@group(0) @binding(4) var<storage, read> NormW: array<f32>;
@group(0) @binding(5) var<uniform> P: Params;
@group(0) @binding(6) var<storage, read> S: array<u32>;

const MAX_HEAD_DIM: u32 = 512u;
var<workgroup> buf: array<f32, MAX_HEAD_DIM>;
var<workgroup> partial: array<f32, WG>;

fn store(kind: u32, src: u32, dst: u32, d: u32, v: f32) {
    if (kind == 0u) {
        QKV[src + d] = v;
    } else if (kind == 1u) {
        Kc[dst + d] = kv_t(v);
    } else {
        Vc[dst + d] = kv_t(v);
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let b = wid.y;
    let pos = S[0] + b;
    let row = select(pos, pos % P.ring, P.ring != 0u);
    let hd = P.head_dim;
    var kind = 0u;
    var src = b * P.qkv_stride + h * P.q_stride;
    var dst = 0u;
    if (h >= P.n_head + P.n_kv) {
        kind = 2u;
        src = b * P.qkv_stride + P.v_off + (h - P.n_head - P.n_kv) * hd;
        dst = row * P.kv_dim + (h - P.n_head - P.n_kv) * hd;
    } else if (h >= P.n_head) {
        kind = 1u;
        src = b * P.qkv_stride + P.k_off + (h - P.n_head) * hd;
        dst = row * P.kv_dim + (h - P.n_head) * hd;
    }
    for (var d = lid; d < hd; d += WG) {
        buf[d] = QKV[src + d];
    }
    workgroupBarrier();
    if ((P.has_norm != 0u && kind < 2u) || (P.v_norm != 0u && kind == 2u)) {
        var acc = 0.0;
        for (var d = lid; d < hd; d += WG) {
            acc += buf[d] * buf[d];
        }
        partial[lid] = acc;
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (lid < s) {
                partial[lid] += partial[lid + s];
            }
            workgroupBarrier();
        }
        let r = inverseSqrt(partial[0] / f32(hd) + P.eps);
        let wo = select(0u, P.norm_k_off, kind == 1u);
        workgroupBarrier();
        for (var d = lid; d < hd; d += WG) {
            buf[d] = buf[d] * r * select(NormW[wo + d], 1.0, kind == 2u);
        }
        workgroupBarrier();
    }
    let half_rot = P.n_rot / 2u;
    if (kind < 2u) {
        for (var i = lid; i < half_rot; i += WG) {
            var a = 2u * i;
            var c = 2u * i + 1u;
            if (P.neox != 0u) {
                a = i;
                c = i + half_rot;
            }
            let cs = (pos * half_rot + i) * 2u;
            let co = CS[cs];
            let si = CS[cs + 1u];
            let x0 = buf[a];
            let x1 = buf[c];
            store(kind, src, dst, a, x0 * co - x1 * si);
            store(kind, src, dst, c, x0 * si + x1 * co);
        }
        for (var d = P.n_rot + lid; d < hd; d += WG) {
            store(kind, src, dst, d, buf[d]);
        }
    } else {
        for (var d = lid; d < hd; d += WG) {
            store(kind, src, dst, d, buf[d]);
        }
    }
}
