// The combine step of attention split along the sequence (flash-decoding): each chunk c of CHUNK keys
// of head h of token b left, at Part[partial_base(b, h, c)..], its max score m_c, its sum of
// exp(score - m_c) l_c and its unnormalised weighted sum of V (head_dim values). With M the largest
// m_c, the output is sum_c exp(m_c - M) * acc_c / sum_c exp(m_c - M) * l_c: the softmax over all the
// token's keys, as if one workgroup had seen them. Token b at position S[0] + b has ceil(n / CHUNK)
// chunks (n = S[0] + b + 1 keys); every thread of the head's workgroup works out M and the
// denominator itself (a few dozen chunks at most) and then writes its dims.

struct Params {
    n_head: u32,
    head_dim: u32,
    out_stride: u32,
    ctx: u32,
    part_off: u32,
}

@group(0) @binding(0) var<storage, read> Part: array<f32>;
@group(0) @binding(1) var<storage, read_write> Out: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;
@group(0) @binding(3) var<storage, read> S: array<u32>;

fn partial_base(b: u32, h: u32, c: u32) -> u32 {
    let chunks = (P.ctx + CHUNK - 1u) / CHUNK;
    return P.part_off + ((b * P.n_head + h) * chunks + c) * (P.head_dim + 2u);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let b = wid.y;
    let n = S[0] + b + 1u;
    let used = (n + CHUNK - 1u) / CHUNK;
    var m = -3.4e38;
    for (var c = 0u; c < used; c++) {
        m = max(m, Part[partial_base(b, h, c)]);
    }
    var l = 0.0;
    for (var c = 0u; c < used; c++) {
        let pb = partial_base(b, h, c);
        l += exp(Part[pb] - m) * Part[pb + 1u];
    }
    for (var d = lid; d < P.head_dim; d += WG) {
        var acc = 0.0;
        for (var c = 0u; c < used; c++) {
            let pb = partial_base(b, h, c);
            acc += exp(Part[pb] - m) * Part[pb + 2u + d];
        }
        Out[b * P.out_stride + h * P.head_dim + d] = acc / l;
    }
}
