/*
 * floor_spawn N PROGRAM [ARGS...]: the "floor" launcher of bench/run_bench.py, i.e. the least
 * any launcher must do. It posix_spawn()s N copies of PROGRAM with LOCAL_RANK=0..N-1 (and
 * RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RESTART_COUNT=0) added to its own
 * environment, waits for all of them and exits 0 if they all did (1 otherwise).
 * No supervision, no log handling.
 *
 * floor_spawn --restart N PROGRAM [ARGS...]: the floor of a restart, i.e. reap + respawn. It starts
 * attempt 0 as above; when the first worker ends it SIGTERMs the others, reaps them, and starts
 * all N again with TORCHELASTIC_RESTART_COUNT=1, then waits for them (bench/run_bench.py's
 * restart: the driver SIGKILLs one worker of attempt 0).
 */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

extern char** environ;

static int spawnAll(int n, char** argv, pid_t* pids, const char* attempt) {
  setenv("TORCHELASTIC_RESTART_COUNT", attempt, 1);
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    char r[32];
    snprintf(r, sizeof r, "%d", i);
    setenv("LOCAL_RANK", r, 1);
    setenv("RANK", r, 1);
    if (posix_spawn(&pids[i], argv[0], NULL, NULL, argv, environ) != 0) {
      perror("floor_spawn: posix_spawn");
      pids[i] = -1;
      failed = 1;
    }
  }
  return failed;
}

int main(int argc, char** argv) {
  int restart = argc > 1 && strcmp(argv[1], "--restart") == 0;
  if (restart) {
    --argc;
    ++argv;
  }
  if (argc < 3) {
    fprintf(stderr, "usage: floor_spawn [--restart] N PROGRAM [ARGS...]\n");
    return 2;
  }
  int n = atoi(argv[1]);
  if (n < 1 || n > 1024) return 2;
  char nbuf[32];
  snprintf(nbuf, sizeof nbuf, "%d", n);
  setenv("WORLD_SIZE", nbuf, 1);
  setenv("LOCAL_WORLD_SIZE", nbuf, 1);
  pid_t pids[1024];
  int failed = spawnAll(n, argv + 2, pids, "0");
  int status;
  if (restart) {
    pid_t first = wait(&status);
    for (int i = 0; i < n; ++i) {
      if (pids[i] > 0 && pids[i] != first) kill(pids[i], SIGTERM);
    }
    for (int i = 1; i < n; ++i) wait(&status);
    failed |= spawnAll(n, argv + 2, pids, "1");
  }
  while (wait(&status) > 0) {
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  return failed;
}
