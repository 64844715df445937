// Q8_0: 32 elements in 34 bytes: f16 d, 32 signed bytes; value = d * q.
fn unit_w(rb: u32, e0: u32, cols: u32) -> array<vec4<f32>, 2> {
    let base = rb + (e0 >> 5u) * 34u;
    let d = half_at(base);
    let qs = base + 2u + (e0 & 31u);
    return array<vec4<f32>, 2>(d * signed_bytes(u32_at(qs)), d * signed_bytes(u32_at(qs + 4u)));
}
