// Byte-addressed reads of raw ggml blocks held in an array<u32> named W.
// Blocks are 18, 20, 34, 144, 176 or 210 bytes, so fields are not 4-byte aligned: every read goes
// through these helpers. Little-endian, as GGUF is.

fn byte_at(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) << 3u)) & 0xffu;
}

// An f16 at an even byte offset, as f32 (no shader-f16 needed).
fn half_at(b: u32) -> f32 {
    return unpack2x16float((W[b >> 2u] >> ((b & 2u) << 3u)) & 0xffffu).x;
}

fn i8_at(b: u32) -> f32 {
    return f32(bitcast<i32>(byte_at(b) << 24u) >> 24u);
}
