// Q5_K: 256 elements in 176 bytes: f16 d, f16 dmin, 12 bytes of scales/mins, 32 bytes qh, 128 bytes qs.
// As Q4_K, plus bit s of qh[l] as the fifth bit (16) of element l of sub-block s.
fn unit_vals(rb: u32, e0: u32, cols: u32) -> array<f32, 8> {
    let base = rb + (e0 >> 8u) * 176u;
    let s = (e0 & 255u) >> 5u;
    let sm = k_scale_min(base + 4u, s);
    let dl = half_at(base) * sm.x;
    let ml = half_at(base + 2u) * sm.y;
    let shift = (s & 1u) * 4u;
    let l0 = e0 & 31u;
    let qs = base + 48u + (s >> 1u) * 32u + l0;
    let qh = base + 16u + l0;
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let q = ((byte_at(qs + i) >> shift) & 15u) | (((byte_at(qh + i) >> s) & 1u) << 4u);
        v[i] = dl * f32(q) - ml;
    }
    return v;
}
