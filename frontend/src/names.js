// What the tab calls the run's replicas: under ParameterServerStrategy each worker is one replica
// of the run (the `/inputs` route's `strategy`), named "worker N"; else "replica N". Set once per
// drawn run (index.js), read by every view that names a replica.
const PSS = 'ParameterServerStrategy';
let noun = 'replica';

/** Names the replicas of the run about to be drawn after its `strategy` ("" for most runs). */
export function setStrategy(strategy) {
  noun = strategy === PSS ? 'worker' : 'replica';
}

/** Whether `strategy` is ParameterServerStrategy. */
export const isPss = (strategy) => strategy === PSS;

/** "replica" or "worker". */
export const replicaNoun = () => noun;

/** "replica 3" or "worker 3". */
export const replicaName = (id) => `${noun} ${id}`;

/** "replicas 0, 1" or "workers 0, 1", from the ids' text. */
export const replicasName = (text) => `${noun}s ${text}`;
