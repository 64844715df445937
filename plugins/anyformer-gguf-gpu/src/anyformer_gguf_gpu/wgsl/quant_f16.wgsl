// F16: 2 bytes an element.
fn unit_vals(rb: u32, e0: u32, cols: u32) -> array<f32, 8> {
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let e = e0 + i;
        v[i] = select(0.0, half_at(rb + 2u * e), e < cols);
    }
    return v;
}
