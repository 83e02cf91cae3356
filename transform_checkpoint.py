r"""Slice, re-slice or merge checkpoints by MindSpore strategy files.

  full -> per rank:      python transform_checkpoint.py --src_checkpoint full.ckpt --dst_checkpoint out/ \
                             --dst_strategy strategy/train_strategy/
  per rank -> per rank:  ... --src_checkpoint in/ --src_strategy strategy/train_strategy/ --dst_strategy strategy/infer_strategy/
  per rank -> full:      ... --src_checkpoint in/ --src_strategy strategy/train_strategy/   (no --dst_strategy)

A training step, save_ckpt_dir/step_N, is a per-rank source (each rank's policy.safetensors); a one-rank source
needs no --src_strategy. Output: dst_checkpoint/rank_N/<prefix>N.<format>. The destination appears only when
complete.

MindRLHF's flags work as there: --dst_checkpoint_dir (= --dst_checkpoint); --world_size W --rank_id r makes
this invocation write only the destination ranks N with N % W == r (run W of them, e.g. one per node; each
rank directory appears only when complete); --transform_process_num P splits this invocation's ranks over P
spawned worker processes (each imports MindSpore and reads the source: for large checkpoints on many
cores); --transform_by_rank is accepted and changes nothing (the output is the same).
"""
import argparse
import errno
import sys

from mindrlhf.checkpoint.slicing import transform
from mindrlhf.configs.errors import CheckpointError, ConfigError


# the disk or quota is full, a file too large, a read-only filesystem: said in one line, not a traceback
_WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src_checkpoint", required=True, help="full .ckpt/.safetensors/HF dir, or a dir of rank_N/ "
                   "(a training step_N too)")
    p.add_argument("--dst_checkpoint", "--dst_checkpoint_dir", dest="dst_checkpoint", required=True,
                   help="output directory (replaced atomically)")
    p.add_argument("--dst_strategy", default=None, help="strategy file or directory; omit to merge into one file")
    p.add_argument("--src_strategy", default=None, help="strategy of a per-rank source")
    p.add_argument("--format", default="ckpt", choices=["ckpt", "safetensors"], help="output format")
    p.add_argument("--prefix", default="checkpoint_", help="output file name prefix")
    p.add_argument("--rank_id", type=int, default=0, help="with --world_size: which share of the ranks to write")
    p.add_argument("--world_size", type=int, default=1, help="number of cooperating invocations")
    p.add_argument("--transform_process_num", type=int, default=1, help="worker processes for this invocation")
    p.add_argument("--transform_by_rank", default=None, help="accepted (MindRLHF); the output is the same either way")
    p.add_argument("--overwrite", action="store_true", help="replace --dst_checkpoint as a whole even when it holds "
                   "files this tool did not write (refused otherwise)")
    p.add_argument("--no_progress", action="store_true")
    args = p.parse_args(argv)
    if args.transform_by_rank is not None:
        print("note: --transform_by_rank changes nothing here (every rank's file is cut the same way)")
    bar = None

    def progress(done, total, name):     # the bar starts with the first parameter, after the inputs are checked
        nonlocal bar
        if args.no_progress:
            return
        if bar is None:
            from tqdm import tqdm
            bar = tqdm(desc="slice", unit="param", total=total)
        bar.update(1)

    try:
        report = transform(args.src_checkpoint, args.dst_checkpoint, args.dst_strategy, args.src_strategy,
                           args.format, args.prefix, progress if args.transform_process_num == 1 else None,
                           rank_id=args.rank_id, world_size=args.world_size, processes=args.transform_process_num,
                           overwrite=args.overwrite)
    except (CheckpointError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno not in _WRITE_ERRORS:
            raise
        print(f"error: {args.dst_checkpoint}: writing the output failed: {err}; the destination is as it was (it "
              f"is replaced only once complete)", file=sys.stderr)
        return 2
    finally:
        if bar is not None:
            bar.close()
    print(f"wrote {report.ranks} rank file(s) for {report.params} parameters ({report.bytes_in / 1e6:.1f} MB) "
          f"to {args.dst_checkpoint} in {report.seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
