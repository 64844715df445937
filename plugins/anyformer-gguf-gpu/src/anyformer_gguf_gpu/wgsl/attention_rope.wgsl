// The ROPE variant of attention_vec4.wgsl: its rotary table and q/k norm weights, and rope_head,
// which leaves in `cur` the head at QKV[src..src+hd) normed (qwen3's q_norm / k_norm: NormW[norm_off..],
// where has_norm) and rotated for position pos (pairs (2i, 2i+1), or (i, i + n_rot/2) with neox), as
// rope_store.wgsl does for the separate dispatch.

@group(0) @binding(7) var<storage, read> CS: array<f32>;
@group(0) @binding(8) var<storage, read> NormW: array<f32>;

var<workgroup> cur: array<f32, MAX_HEAD_DIM>;

fn rope_head(src: u32, norm_off: u32, pos: u32, lid: u32) {
    let hd = P.head_dim;
    for (var d = lid; d < hd; d += WG) {
        cur[d] = QKV[src + d];
    }
    workgroupBarrier();
    if (P.has_norm != 0u) {
        var acc = 0.0;
        for (var d = lid; d < hd; d += WG) {
            acc += cur[d] * cur[d];
        }
        let r = inverseSqrt(reduce_sum(acc, lid) / f32(hd) + P.eps);
        for (var d = lid; d < hd; d += WG) {
            cur[d] = cur[d] * r * NormW[norm_off + d];
        }
        workgroupBarrier();
    }
    let half_rot = P.n_rot / 2u;
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
        let x0 = cur[a];
        let x1 = cur[c];
        cur[a] = x0 * co - x1 * si;
        cur[c] = x0 * si + x1 * co;
    }
    workgroupBarrier();
}

// q . k for a key of an earlier token of this step: k (at QKV[src..src+hd)) normed (where has_norm)
// and rotated for its position pos, computed by one thread from the raw row, as rope_head would.
// q is the workgroup's rotated query in qs (vec4s).
fn step_key_dot(src: u32, pos: u32) -> f32 {
    let hd = P.head_dim;
    var r = 1.0;
    if (P.has_norm != 0u) {
        var acc = 0.0;
        for (var d = 0u; d < hd; d++) {
            acc += QKV[src + d] * QKV[src + d];
        }
        r = inverseSqrt(acc / f32(hd) + P.eps);
    }
    let half_rot = P.n_rot / 2u;
    var s = 0.0;
    for (var i = 0u; i < half_rot; i++) {
        var a = 2u * i;
        var c = 2u * i + 1u;
        if (P.neox != 0u) {
            a = i;
            c = i + half_rot;
        }
        let cs = (pos * half_rot + i) * 2u;
        let co = CS[cs];
        let si = CS[cs + 1u];
        let ka = key_value(src, a, r);
        let kc = key_value(src, c, r);
        s += qs[a / 4u][a % 4u] * (ka * co - kc * si) + qs[c / 4u][c % 4u] * (ka * si + kc * co);
    }
    for (var d = P.n_rot; d < hd; d++) {
        s += qs[d / 4u][d % 4u] * key_value(src, d, r);
    }
    return s;
}

// Dim d of the raw k row at src, normed with its 1 / RMS r and k_norm's weight where has_norm.
fn key_value(src: u32, d: u32, r: f32) -> f32 {
    if (P.has_norm != 0u) {
        return QKV[src + d] * r * NormW[P.norm_k_off + d];
    }
    return QKV[src + d];
}
