// The ROPE variant of matvec.wgsl: q, k and v rows of one token, rotated and stored into the cache.
// Rows [0, q_dim) are q, [q_dim, q_dim + kv_dim) k, then v; the rotation pairs dims (2i, 2i+1) of a
// head (only the first n_rot dims rotate), with cos/sin from the host's table CS[pos][i] as in
// rope_store.wgsl. Returns the row's value as the qkv buffer keeps it (q and k rotated).

@group(0) @binding(5) var<storage, read_write> Kc: array<kv_t>;
@group(0) @binding(6) var<storage, read_write> Vc: array<kv_t>;
@group(0) @binding(7) var<storage, read> CS: array<f32>;
@group(0) @binding(8) var<storage, read> S: array<u32>;

fn rope_epilogue(row: u32, local_row: u32, t: u32, token: u32, value: f32) -> f32 {
    let pos = S[0] + token;
    var out = value;
    if (row < P.q_dim + P.kv_dim) {
        let d = select(row - P.q_dim, row, row < P.q_dim) % P.head_dim;
        if (d < P.n_rot) {
            let partner = rowv[(local_row ^ 1u) * TB + t];
            let cs = (pos * (P.n_rot / 2u) + d / 2u) * 2u;
            let co = CS[cs];
            let si = CS[cs + 1u];
            if ((d & 1u) == 0u) {
                out = value * co - partner * si;
            } else {
                out = partner * si + value * co;
            }
        }
        if (row >= P.q_dim) {
            Kc[pos * P.kv_dim + row - P.q_dim] = kv_t(out);
        }
    } else {
        Vc[pos * P.kv_dim + row - P.q_dim - P.kv_dim] = kv_t(out);
    }
    return out;
}
