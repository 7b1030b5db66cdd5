// The status bar's "slice" item: what this session's Slurm job holds (GPUs, CPUs, memory) and the
// walltime left, counted down here between reads of GET dsportal/api/slice.
import { Widget } from '@lumino/widgets';

import { api, duration, state } from './api';

export const SLICE_CHANGED = 'dsportal-slice-changed'; // a window event: read the slice again

export interface Slice {
  job_id: number | null;
  partition: string;
  node: string;
  gpus: number;
  share: string | null; // '¼ GPU': one share of a GPU others share too
  cpus: number;
  memory_mb: number;
  time_limit_s: number | null;
  time_left_s: number | null;
}

const TICK_MS = 15_000; // the text's own countdown
const READ_MS = 300_000; // ask Slurm again (an admin may extend the time limit)

function memory(mb: number): string {
  return mb >= 1024 ? `${Math.round(mb / 102.4) / 10} GB`.replace('.0 GB', ' GB') : `${mb} MB`;
}

export class SliceStatus extends Widget {
  /** ``extend``: what a click does (ask for more walltime). */
  constructor(extend: () => void) {
    super();
    this.addClass('dsportal-SliceStatus');
    this.addClass('jp-StatusBar-TextItem');
    this.node.textContent = 'Slurm job …';
    this.node.style.cursor = 'pointer';
    this.node.addEventListener('click', extend);
    void this._read();
    this._tick = window.setInterval(() => this._show(), TICK_MS);
    this._reread = window.setInterval(() => void this._read(), READ_MS);
    window.addEventListener(SLICE_CHANGED, this._changed);
  }

  dispose(): void {
    window.clearInterval(this._tick);
    window.clearInterval(this._reread);
    window.removeEventListener(SLICE_CHANGED, this._changed);
    super.dispose();
  }

  private _changed = () => void this._read();

  private async _read(): Promise<void> {
    try {
      this._slice = await api<Slice>('GET', 'slice');
      this._readAt = Date.now();
      state.slice = this._slice;
    } catch (error) {
      this.node.title = `The session's slice could not be read: ${(error as Error).message}`;
    }
    this._show();
  }

  private _show(): void {
    const slice = this._slice;
    if (!slice || slice.job_id === null) {
      return;
    }
    const parts = [
      slice.share ?? (slice.gpus === 1 ? '1 GPU' : `${slice.gpus} GPUs`),
      `${slice.cpus} CPUs`,
      memory(slice.memory_mb)
    ];
    let left = '';
    if (slice.time_left_s !== null) {
      left = duration(slice.time_left_s - (Date.now() - this._readAt) / 1000);
      parts.push(`${left} left`);
    }
    this.node.textContent = parts.join(' · ');
    this.node.title =
      `Your session is Slurm job ${slice.job_id} on ${slice.node || 'its node'} (partition ${slice.partition}): ` +
      `${parts.slice(0, 3).join(', ')}` +
      (left ? `; it ends in ${left}, when its walltime runs out. Save your work before then. Click to extend it.` : '.');
  }

  private _slice: Slice | null = null;
  private _readAt = 0;
  private _tick: number;
  private _reread: number;
}
