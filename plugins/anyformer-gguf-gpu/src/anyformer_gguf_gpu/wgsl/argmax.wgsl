// Greedy sampling on the GPU: the index of the largest logit (the lowest index on a tie) is written
// to Ids[pos + n_batch], where the next step's embedding lookup reads it: no read-back in the loop.
// EMBED (a constant; the host prepends embed_row and the embedding's decoder) also writes that id's
// embedding row as the next step's input, so a decode step needs no embedding dispatch of its own.

struct Params {
    n: u32,
    offset: u32,
    // The embedding table's shape (EMBED): columns, bytes a row, 8-value units a row, rows.
    e_cols: u32,
    e_row_bytes: u32,
    e_units: u32,
    e_rows: u32,
}

@group(0) @binding(0) var<storage, read> L: array<f32>;
@group(0) @binding(1) var<storage, read_write> Ids: array<u32>;
@group(0) @binding(2) var<uniform> P: Params;
@group(0) @binding(3) var<storage, read> S: array<u32>;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    var bv = -3.4e38;
    var bi = 0xffffffffu;
    for (var i = lid; i < P.n; i += WG) {
        let v = L[P.offset + i];
        // Strictly greater keeps the lowest index of each thread's equal values.
        if (v > bv || bi == 0xffffffffu) {
            bv = v;
            bi = i;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = best_v[lid + s];
            let oi = best_i[lid + s];
            if (oi != 0xffffffffu && (ov > best_v[lid] || (ov == best_v[lid] && oi < best_i[lid]) || best_i[lid] == 0xffffffffu)) {
                best_v[lid] = ov;
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        Ids[S[0] + S[1]] = best_i[0];
    }
    if (EMBED) {
        embed_row(best_i[0], lid);
    }
}
