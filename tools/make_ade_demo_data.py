"""Write the built-in scene-parsing demo set in the ADE20K (ADEChallengeData2016) layout.

Example:
    python tools/make_ade_demo_data.py --out data/demo_ade/ADEChallengeData2016
    python tools/test.py configs/upernet_swin_t_512x512_160k_ade20k.py CKPT \
        --cfg-options test_dataloader.dataset.data_root=data/demo_ade/ADEChallengeData2016
"""
import argparse
import json
import time

from mmvit_ext.datasets import demo_ade_ready, generate_demo_ade


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='data/demo_ade/ADEChallengeData2016',
                        help='the ADEChallengeData2016 directory to write')
    parser.add_argument('--num-train', type=int, default=128)
    parser.add_argument('--num-val', type=int, default=32)
    parser.add_argument('--size', type=int, nargs=2, default=(128, 128), metavar=('H', 'W'))
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--force', action='store_true', help='regenerate even if present')
    args = parser.parse_args()
    settings = dict(num_train=args.num_train, num_val=args.num_val, img_size=tuple(args.size),
                    seed=args.seed)
    if not args.force and demo_ade_ready(args.out, **settings):
        print(f'[ade demo data] {args.out} is ready')
        return
    start = time.perf_counter()
    summary = generate_demo_ade(args.out, **settings)
    print(f'[ade demo data] wrote {args.out} in {time.perf_counter() - start:.1f} s: '
          f'{json.dumps(summary)}')


if __name__ == '__main__':
    main()
