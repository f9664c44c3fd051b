// Yardstick firmware: one .tflite model run by TFLM's MicroInterpreter (built with
// OPTIMIZED_KERNEL_DIR=cmsis_nn), instructions per Invoke counted with SysTick under QEMU
// -icount. The model, its inputs and the op list come from the generated yardstick_model.h
// (tests/yardstick/tflm_yardstick.py). Output, one item a line, read back by that script:
//   arena <bytes>            the interpreter's arena_used_bytes() after AllocateTensors
//   ticks <n>                SysTick ticks of one Invoke (one line per run)
//   out<i> <hex bytes>       output i after the last run
//   done
#include <stdint.h>
#include <string.h>

#include "tensorflow/lite/micro/cortex_m_generic/debug_log_callback.h"
#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "yardstick_model.h"

extern "C" {
void ys_puts(const char* s);
void ys_put_u64(uint64_t v);
void ys_put_hex(const uint8_t* p, uint32_t n);
void ys_counter_start(void);
uint64_t ys_counter_read(void);
void ys_exit(int status);
}

alignas(16) static uint8_t arena[YS_ARENA_BYTES];

static void fail(const char* what) {
  ys_puts("yardstick: ");
  ys_puts(what);
  ys_puts("\n");
  ys_exit(1);
}

int main() {
  RegisterDebugLogCallback(ys_puts);
  const tflite::Model* model = tflite::GetModel(ys_model_data);
  static tflite::MicroMutableOpResolver<YS_OP_COUNT> resolver;
  YS_REGISTER_OPS(resolver);
  static tflite::MicroInterpreter interpreter(model, resolver, arena, sizeof arena);
  if (interpreter.AllocateTensors() != kTfLiteOk) fail("AllocateTensors failed");
  if (interpreter.inputs_size() != YS_INPUT_COUNT) fail("unexpected number of inputs");
  ys_puts("arena ");
  ys_put_u64(interpreter.arena_used_bytes());
  ys_puts("\n");
  ys_counter_start();
  for (int run = 0; run < YS_RUNS; ++run) {
    // The input is written before every Invoke: TFLM may overlay activations on the input
    // tensor, and a stale input would change the data-dependent branches of later runs.
    for (uint32_t i = 0; i < YS_INPUT_COUNT; ++i) {
      TfLiteTensor* t = interpreter.input(i);
      if (t->bytes != ys_input_bytes[i]) fail("input size differs from the model's");
      memcpy(t->data.raw, ys_inputs[i], t->bytes);
    }
    uint64_t t0 = ys_counter_read();
    TfLiteStatus status = interpreter.Invoke();
    uint64_t t1 = ys_counter_read();
    if (status != kTfLiteOk) fail("Invoke failed");
    ys_puts("ticks ");
    ys_put_u64(t1 - t0);
    ys_puts("\n");
  }
  for (uint32_t i = 0; i < interpreter.outputs_size(); ++i) {
    const TfLiteTensor* t = interpreter.output(i);
    ys_puts("out");
    ys_put_u64(i);
    ys_puts(" ");
    ys_put_hex(reinterpret_cast<const uint8_t*>(t->data.raw), t->bytes);
    ys_puts("\n");
  }
  ys_puts("done\n");
  ys_exit(0);
  return 0;
}
