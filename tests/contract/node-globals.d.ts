// The Node.js globals that client.ts and the README's block use, declared here rather
// than installing @types/node: tsc would check its 50,000 lines at every run, most of
// the test's time.
declare const process: {
  argv: string[];
  env: Record<string, string | undefined>;
  exitCode?: number;
  exit(code?: number): never;
};
