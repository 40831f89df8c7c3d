/*
 * floor_spawn N PROGRAM [ARGS...]: the "floor" launcher of bench/run_bench.py, i.e. the least
 * any launcher must do. It posix_spawn()s N copies of PROGRAM with LOCAL_RANK=0..N-1 (and
 * RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RESTART_COUNT=0) added to its own
 * environment, waits for all of them and exits 0 if they all did (1 otherwise).
 * No supervision, no restarts, no log handling.
 */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char** environ;

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: floor_spawn N PROGRAM [ARGS...]\n");
    return 2;
  }
  int n = atoi(argv[1]);
  if (n < 1 || n > 1024) return 2;
  char nbuf[32];
  snprintf(nbuf, sizeof nbuf, "%d", n);
  setenv("WORLD_SIZE", nbuf, 1);
  setenv("LOCAL_WORLD_SIZE", nbuf, 1);
  setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    char r[32];
    snprintf(r, sizeof r, "%d", i);
    setenv("LOCAL_RANK", r, 1);
    setenv("RANK", r, 1);
    pid_t pid;
    if (posix_spawn(&pid, argv[2], NULL, NULL, argv + 2, environ) != 0) {
      perror("floor_spawn: posix_spawn");
      failed = 1;
    }
  }
  int status;
  while (wait(&status) > 0) {
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  return failed;
}
