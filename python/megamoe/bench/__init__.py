"""megamoe-bench, the benchmarks on the GPU machine, as modules of the package; tools/megamoe-bench/megamoe-bench is
its entry point (cli.main), and `megamoe-bench --help` says what each subcommand measures. `import megamoe` does not
import this package: only the entry point and the tests do.

  cli          the command line (argparse) and the relaunch of `layer` under torch.distributed.run
  cases        the gemm cases and their group sizes; the layer's presets, routings and token cases
  timing       medians after a steady lead, steps in turns, interleaved rounds, one step's kernel timeline
  clocks       nvidia-smi's clock, power and clock event reasons (layer --clocks)
  runtime      libmegamoe through the package's bindings: Megamoe (kernels, launches), Layer (megamoe_layer)
  gemm         megamoe-bench gemm (bf16 grouped GEMMs against torch._grouped_mm and dense cuBLAS)
  gemm_fp8     megamoe-bench gemm --dtype fp8
  dense        the layer's dense cuBLAS anchor and dense-equivalent times
  pipeline     the PyTorch pipeline the layer is timed against, and the distributed fp32 reference
  ranks        collectives every rank calls in step (errors on all ranks, verdicts over ranks)
  layer_bench  one rank's side of megamoe-bench layer: inputs, every case, stage medians
  layer        megamoe-bench layer: the cases in order, one run per --dedup mode, the JSON
  report       what rank 0 prints of the layer's cases; the random / whole-tile summary
  plots        layer --plot
"""
