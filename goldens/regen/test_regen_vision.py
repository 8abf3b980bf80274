"""The PNG encoder of vision_preprocess.py against Pillow's decoder: every colour type and bit
depth, plain and Adam7, odd sizes; each file decodes to the samples it was given.
Run: python3 goldens/regen/test_regen_vision.py  (or unittest discover -s goldens/regen -p 'test_regen*')
"""
import io
import random
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vision_preprocess as vp  # noqa: E402


def samples(rng, w, h, channels, depth):
    top = (1 << depth) - 1
    return [[tuple(rng.randint(0, top) for _ in range(channels)) for _ in range(w)] for _ in range(h)]


class PngEncoder(unittest.TestCase):
    def decoded(self, png):
        import numpy as np
        from PIL import Image

        with Image.open(io.BytesIO(png)) as im:
            im.load()
            return im.mode, np.asarray(im), im

    def test_every_colour_type_and_depth_round_trips_through_pillow(self):
        import numpy as np

        rng = random.Random(5)
        combos = [(0, d) for d in (1, 2, 4, 8, 16)] + [(2, 8), (2, 16), (3, 1), (3, 2), (3, 4), (3, 8),
                                                        (4, 8), (4, 16), (6, 8), (6, 16)]
        for colour_type, depth in combos:
            for interlace in (False, True):
                for w, h in [(1, 1), (7, 5), (13, 9)]:
                    with self.subTest(colour_type=colour_type, depth=depth, interlace=interlace, size=(w, h)):
                        px = samples(rng, w, h, vp.CHANNELS[colour_type], depth)
                        palette = vp.palette_bytes(1 << depth, 3) if colour_type == 3 else None
                        png = vp.encode_png(w, h, depth, colour_type, px, palette=palette, interlace=interlace)
                        mode, got, im = self.decoded(png)
                        want = np.array(px, dtype=np.int64)
                        if colour_type == 0 and depth in (2, 4):  # mode L, scaled (1 bit: mode "1", 0/1)
                            want = want * (255 // ((1 << depth) - 1))
                        elif depth == 16 and colour_type != 0:
                            want = want >> 8  # Pillow keeps the high byte of these
                        if colour_type == 4 and depth == 16:  # opened as RGBA: L, L, L, A
                            want = want[..., [0, 0, 0, 1]]
                        self.assertEqual(got.reshape(h, w, -1).astype(np.int64).tolist(),
                                         want.reshape(h, w, -1).tolist(), mode)

    def test_filters_are_all_used_and_lossless(self):
        rng = random.Random(9)
        px = [[(rng.randint(0, 255), (x * 3) % 256, (x + y) % 256) for x in range(40)] for y in range(30)]
        raw = vp.encode_png(40, 30, 8, 2, px)
        import zlib
        idat = raw[raw.index(b"IDAT") + 4:]
        data = zlib.decompressobj().decompress(idat)
        kinds = {data[y * (1 + 120)] for y in range(30)}
        self.assertTrue(len(kinds) >= 2, kinds)
        _, got, _ = self.decoded(raw)
        self.assertEqual(got.tolist(), [[list(p) for p in row] for row in px])


if __name__ == "__main__":
    unittest.main()
