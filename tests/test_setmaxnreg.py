"""[Note: setmaxnreg's pool] (codegen/gemm_wgmma.py): a warp-specialized kernel's producer gives up registers with
`setmaxnreg.dec` and its consumers take them with `setmaxnreg.inc` from the CTA's own pool, the registers the block
was launched with; counts that sum past it leave the consumers waiting forever (the gathering stem's 96 + 2 x 208
over 384 threads did on an H100). Every form's counts, as its module computes them and as its source says them, fit."""
from __future__ import annotations

import re

import pytest

from aicfc.codegen import conv, conv_band, conv_pool, conv_taps, conv_wgmma, gemm_wgmma
from tests.test_gather_stem import _plan, _stem


def fits(threads: int, producer: int, consumer: int) -> bool:
    """One producer warpgroup at `producer` registers a thread and the rest of the block's threads at `consumer`,
    within the block's launch registers."""
    return 128 * producer + (threads - 128) * consumer <= gemm_wgmma.launch_registers(threads) * threads


def test_launch_registers_are_what_ptxas_gives_a_block_alone():
    assert [gemm_wgmma.launch_registers(t) for t in (256, 384, 512)] == [255, 168, 128]


FORMS = ([("gemm_wgmma", n, gemm_wgmma.PRODUCER_REGS,
           gemm_wgmma.consumer_regs(n, gemm_wgmma.PRODUCER_REGS, gemm_wgmma.CONSUMER_REGS)) for n in (1, 2, 3)]
         + [("conv_wgmma", n, conv_wgmma.PRODUCER_REGS,
             gemm_wgmma.consumer_regs(n, conv_wgmma.PRODUCER_REGS, conv_wgmma.CONSUMER_REGS)) for n in (1, 2, 3)]
         + [("conv_pool", n, conv_pool.PRODUCER_REGS, conv_pool.CONSUMER_REGS[n]) for n in (1, 2, 3)]
         + [("conv_pool gathering", n, conv_pool.GATHER_REGS[0], conv_pool.GATHER_REGS[1][n]) for n in (1, 2, 3)]
         + [("conv_band", conv_band.NWG, conv_band.PRODUCER_REGS, conv_band.CONSUMER_REGS),
            ("conv_taps", 3, conv_taps.PRODUCER_REGS, conv_taps.CONSUMER_REGS)])


@pytest.mark.parametrize("form,consumers,producer,consumer", FORMS, ids=[f"{f[0]}-{f[1]}" for f in FORMS])
def test_every_form_fits_its_blocks_launch_registers(form, consumers, producer, consumer):
    assert consumer % 8 == 0 and fits(128 * (consumers + 1), producer, consumer), (form, producer, consumer)


def test_the_counts_that_hung_do_not_fit_and_the_stem_now_takes_200():
    assert not fits(384, 96, 208)
    assert conv_pool.GATHER_REGS[1][2] == 200 and fits(384, 96, 200)
    # the GEMM engine's two-warpgroup counts fill the pool exactly, as before
    assert 128 * 40 + 256 * 232 == gemm_wgmma.launch_registers(384) * 384


@pytest.mark.parametrize("pin", [{"XP": 1, "TPH": 7, "TPW": 7}, {"XP": 0}, {"GA": 1}], ids=["xp", "rows", "ahead"])
def test_the_gathering_stems_source_asks_for_what_fits(pin):
    plan = _plan(pin={k: str(v) for k, v in pin.items()})
    k = _stem(plan)
    src = conv.render_kernel(k, k.schedule.param, plan.types(), "k")
    (threads,) = map(int, re.findall(r"__launch_bounds__\((\d+), 1\)", src))
    (dec,) = map(int, re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32 (\d+);", src))
    (inc,) = map(int, re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32 (\d+);", src))
    assert threads == 128 * (k.schedule.param["NCONS"] + 1) and fits(threads, dec, inc), (threads, dec, inc)
