"""Write the built-in demo set: synthetic shapes in COCO instance-segmentation format.

Example:
    python tools/make_demo_data.py --out data/demo_shapes --num-train 128 --num-val 24
"""
import argparse
import json
import time

from mmvit_ext.datasets import demo_data_ready, generate_demo_coco


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='data/demo_shapes', help='output root')
    parser.add_argument('--num-train', type=int, default=128)
    parser.add_argument('--num-val', type=int, default=24)
    parser.add_argument('--size', type=int, nargs=2, default=(192, 192), metavar=('H', 'W'))
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--force', action='store_true', help='regenerate even if present')
    args = parser.parse_args()
    settings = dict(num_train=args.num_train, num_val=args.num_val, img_size=tuple(args.size),
                    seed=args.seed)
    if not args.force and demo_data_ready(args.out, **settings):
        print(f'[demo data] {args.out} is ready')
        return
    start = time.perf_counter()
    summary = generate_demo_coco(args.out, **settings)
    print(f'[demo data] wrote {args.out} in {time.perf_counter() - start:.1f} s: '
          f'{json.dumps(summary)}')


if __name__ == '__main__':
    main()
