#pragma once
// Sleeps the FSDP engine takes before issuing its collectives: tests set rank-dependent values
// to shake out ordering assumptions (seed 001's delay_before_all_gather and
// delay_before_reduce_scatter). Zero outside tests.
namespace fsdpp::detail {

struct FSDPTestingDelays {
  int before_all_gather_ms = 0;
  int before_reduce_scatter_ms = 0;
};
FSDPTestingDelays& testing_delays();
// Sleeps `ms` milliseconds when positive.
void testing_delay(int ms);

}  // namespace fsdpp::detail
