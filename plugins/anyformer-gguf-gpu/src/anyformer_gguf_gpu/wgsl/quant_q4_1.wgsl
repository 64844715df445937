// Q4_1: 32 elements in 20 bytes: f16 d, f16 m, 16 bytes of nibbles (laid out as Q4_0); value = d * q + m.
fn unit_vals(rb: u32, e0: u32, cols: u32) -> array<f32, 8> {
    let base = rb + (e0 >> 5u) * 20u;
    let d = half_at(base);
    let m = half_at(base + 2u);
    let j0 = e0 & 31u;
    let shift = (j0 >> 4u) * 4u;
    let qs = base + 4u + (j0 & 15u);
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = d * f32((byte_at(qs + i) >> shift) & 15u) + m;
    }
    return v;
}
