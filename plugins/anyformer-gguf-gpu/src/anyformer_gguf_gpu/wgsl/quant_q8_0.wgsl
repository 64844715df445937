// Q8_0: 32 elements in 34 bytes: f16 d, 32 signed bytes; value = d * q.
fn unit_vals(rb: u32, e0: u32, cols: u32) -> array<f32, 8> {
    let base = rb + (e0 >> 5u) * 34u;
    let d = half_at(base);
    let qs = base + 2u + (e0 & 31u);
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = d * i8_at(qs + i);
    }
    return v;
}
