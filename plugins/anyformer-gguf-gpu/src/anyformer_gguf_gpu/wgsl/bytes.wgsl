// Reads of raw ggml blocks held in an array<u32> named W. Blocks are 18, 20, 34, 144, 176 or 210
// bytes, so fields are not always 4-byte aligned: u32_at reads 4 bytes at any offset (two loads
// and a funnel shift when unaligned). Weight buffers carry 16 bytes of padding, so the second load
// of the last word stays inside. Little-endian, as GGUF is.

fn u32_at(b: u32) -> u32 {
    let i = b >> 2u;
    let s = (b & 3u) << 3u;
    if (s == 0u) {
        return W[i];
    }
    return (W[i] >> s) | (W[i + 1u] << (32u - s));
}

// An f16 at an even byte offset, as f32 (no shader-f16 needed).
fn half_at(b: u32) -> f32 {
    return unpack2x16float((W[b >> 2u] >> ((b & 2u) << 3u)) & 0xffffu).x;
}

fn byte_at(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) << 3u)) & 0xffu;
}

fn i8_at(b: u32) -> f32 {
    return f32(bitcast<i32>(byte_at(b) << 24u) >> 24u);
}

// The four bytes of w, each shifted right by `shift` and masked: nibbles (mask 15) or bit fields.
fn fields(w: u32, shift: u32, mask: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(mask);
}

// The four bytes of w as signed integers.
fn signed_bytes(w: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}
