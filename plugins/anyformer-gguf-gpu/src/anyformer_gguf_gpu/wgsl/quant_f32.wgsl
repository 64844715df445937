// F32: 4 bytes an element. unit_vals gives the 8 elements of row element e0..e0+7 (0 past cols).
fn unit_vals(rb: u32, e0: u32, cols: u32) -> array<f32, 8> {
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let e = e0 + i;
        v[i] = select(0.0, bitcast<f32>(W[(rb >> 2u) + e]), e < cols);
    }
    return v;
}
