"""A complete PNG check for the script tests, without extra packages: signature,
every chunk's CRC, IHDR first and IEND last, the inflated pixel data exactly the
size IHDR implies, and a decode through matplotlib."""

import struct
import zlib


def png_info(path):
    """Returns (width, height, distinct colours, pixels as an H x W x C float array); raises on any defect."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: bad PNG signature"
    pos, chunks, idat = 8, [], b""
    width = height = depth = colour_type = None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        ctype = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(ctype + body) & 0xFFFFFFFF == crc, f"{path}: CRC mismatch in {ctype!r}"
        chunks.append(ctype)
        if ctype == b"IHDR":
            width, height, depth, colour_type = struct.unpack(">IIBB", body[:10])
        if ctype == b"IDAT":
            idat += body
        pos += 12 + length
    assert chunks and chunks[0] == b"IHDR" and chunks[-1] == b"IEND", f"{path}: chunks {chunks}"
    assert depth == 8, f"{path}: bit depth {depth}"
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour_type]
    raw = zlib.decompress(idat)
    assert len(raw) == height * (1 + width * channels), f"{path}: pixel data does not match IHDR"
    import matplotlib.image
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width), f"{path}: decoded shape {pixels.shape}"
    flat = (pixels.reshape(-1, pixels.shape[-1]) * 255).round().astype("uint8")
    colours = len({bytes(p) for p in flat[::7]})
    return width, height, colours, pixels
