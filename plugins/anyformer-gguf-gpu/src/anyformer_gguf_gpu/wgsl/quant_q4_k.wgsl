// Q4_K: 256 elements in 144 bytes: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles.
// Sub-block s (32 elements) is the low (s even) or high (s odd) nibbles of bytes 32*(s/2)..+31;
// value = d * scale_s * q - dmin * min_s.
fn unit_vals(rb: u32, e0: u32, cols: u32) -> array<f32, 8> {
    let base = rb + (e0 >> 8u) * 144u;
    let s = (e0 & 255u) >> 5u;
    let sm = k_scale_min(base + 4u, s);
    let dl = half_at(base) * sm.x;
    let ml = half_at(base + 2u) * sm.y;
    let shift = (s & 1u) * 4u;
    let qs = base + 16u + (s >> 1u) * 32u + (e0 & 31u);
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = dl * f32((byte_at(qs + i) >> shift) & 15u) - ml;
    }
    return v;
}
