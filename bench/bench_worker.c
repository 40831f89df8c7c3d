/*
 * bench_worker: the one worker program every launcher in bench/run_bench.py starts
 * (ddprun, torchrun 1.13, torchrun 2.x and the floor loops), so all of them pay the same
 * exec and start-up cost.
 *
 * First thing in main() it reads CLOCK_MONOTONIC (the clock behind Python's
 * time.monotonic_ns(), which the driver uses for its own timestamps) and writes
 *   $BENCH_OUT/<TORCHELASTIC_RESTART_COUNT>.<LOCAL_RANK>
 * containing "<start_ns> <pid>\n" (written to a temporary name, then renamed, so the driver
 * never reads half a line). Missing env vars count as 0.
 *
 * Then, by $BENCH_MODE:
 *   exit  (default)  return 0 at once
 *   sleep            pause() until a signal; SIGTERM's default action ends it at once
 *   restart          attempt 0 (TORCHELASTIC_RESTART_COUNT=0): sleep as above, so the driver
 *                    can SIGKILL one of them; any later attempt: exit 0
 *
 * Built by run_bench.py with `cc -O2` into its temporary directory; not part of the product.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long envLong(const char* name) {
  const char* v = getenv(name);
  return v && *v ? strtol(v, NULL, 10) : 0;
}

int main(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long long startNs = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;

  const char* out = getenv("BENCH_OUT");
  long attempt = envLong("TORCHELASTIC_RESTART_COUNT");
  long localRank = envLong("LOCAL_RANK");
  if (out) {
    char path[4096], tmp[4200], line[96];
    snprintf(path, sizeof path, "%s/%ld.%ld", out, attempt, localRank);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int n = snprintf(line, sizeof line, "%lld %ld\n", startNs, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, line, (size_t)n) != n || close(fd) != 0 || rename(tmp, path) != 0) {
      perror("bench_worker: write start record");
      return 2;
    }
  }

  const char* mode = getenv("BENCH_MODE");
  if (!mode || strcmp(mode, "exit") == 0) return 0;
  if (strcmp(mode, "sleep") == 0 || (strcmp(mode, "restart") == 0 && attempt == 0)) {
    for (;;) pause();
  }
  return 0;
}
