// The slice's gauges: what the session uses against its slice's limits (GET dsportal/api/usage,
// portal/session/usage/gauges.py), in the status bar and, on a click, in a panel with the details; a
// warning before the memory limit is reached; and, when the limit killed a kernel, a message that
// says so (the server tells at once on Jupyter's event bus, and the reading carries it too).
import { Widget } from '@lumino/widgets';

import { api, state } from './api';

export interface Gpu {
  index: number;
  name: string;
  uuid: string;
  utilization_percent: number | null;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  error: string;
  share: number; // this session holds 1/share of the GPU (0: all of it)
  own_memory_bytes: number | null; // on a share: this session's processes' memory on it
  share_memory_bytes: number | null; // on a share: its part of the GPU's memory (not enforced)
}

const FRACTIONS: { [n: number]: string } = { 2: '½', 3: '⅓', 4: '¼', 5: '⅕', 6: '⅙', 8: '⅛' };

/** '¼' for a share of 4; '' for a whole GPU. */
export function shareName(gpu: Gpu): string {
  return gpu.share ? FRACTIONS[gpu.share] ?? `1/${gpu.share}` : '';
}

/** A share's memory over its part of the GPU: what a neighbour on the same GPU may run out of. */
function overShare(gpu: Gpu): boolean {
  return !!gpu.share && gpu.own_memory_bytes !== null && gpu.share_memory_bytes !== null && gpu.own_memory_bytes > gpu.share_memory_bytes;
}

export interface KernelDeath {
  kernel_id: string;
  kernel_name: string;
  at: number;
  by_memory_limit: boolean;
  message: string;
}

export interface Usage {
  memory: { used_bytes: number; limit_bytes: number; limit_from: string; oom_kills: number; fraction: number };
  cpu: { used_cores: number; cores: number; cores_from: string };
  gpus: Gpu[];
  job_id: string | null;
  memory_warning_fraction: number;
  refresh_s: number;
  kernel_deaths: KernelDeath[];
}

export const OUT_OF_MEMORY = 'https://dsportal.invalid/events/kernel-out-of-memory/v1';

type Notify = (message: string, type?: string) => Promise<string>;

export function bytes(count: number | null): string {
  if (count === null) {
    return '?';
  }
  const gb = count / 2 ** 30;
  return gb >= 1 ? `${gb >= 10 ? Math.round(gb) : gb.toFixed(1)} GB` : `${Math.round(count / 2 ** 20)} MB`;
}

function cores(value: number): string {
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}

/** The status bar's text: memory, CPU and each GPU against the slice. */
export function summary(usage: Usage): string {
  const parts = [
    `Mem ${bytes(usage.memory.used_bytes)} / ${bytes(usage.memory.limit_bytes)}`,
    `CPU ${cores(usage.cpu.used_cores)} / ${cores(usage.cpu.cores)}`
  ];
  for (const gpu of usage.gpus) {
    if (gpu.utilization_percent === null) {
      parts.push(`GPU${gpu.index}${shareName(gpu) ? ' ' + shareName(gpu) : ''} ?`);
    } else if (gpu.share) {
      parts.push(`GPU${gpu.index} ${shareName(gpu)} ${gpu.utilization_percent} % ${bytes(gpu.own_memory_bytes)} / ${bytes(gpu.share_memory_bytes)}`);
    } else {
      parts.push(`GPU${gpu.index} ${gpu.utilization_percent} % ${bytes(gpu.memory_used_bytes)}`);
    }
  }
  return parts.join(' · ');
}

/** Reads the gauges every refresh_s seconds and tells its listeners; warns and reports kernel deaths once each. */
export class UsageWatch {
  constructor(private notify: Notify) {
    void this._read();
  }

  listen(listener: (usage: Usage) => void): void {
    this._listeners.push(listener);
    if (this.usage) {
      listener(this.usage);
    }
  }

  /** A kernel the memory limit killed, from the event bus (at: null, now) or a reading: said once. */
  outOfMemory(kernelId: string, at: number | null, message: string): void {
    const when = at ?? Date.now() / 1000;
    const told = this._told.get(kernelId);
    if (told !== undefined && Math.abs(told - when) < 60) {
      return;
    }
    this._told.set(kernelId, when);
    void this.notify(message, 'error');
  }

  private async _read(): Promise<void> {
    let delay = 30;
    try {
      const usage = await api<Usage>('GET', 'usage');
      this.usage = usage;
      state.usage = usage;
      delay = usage.refresh_s;
      this._check(usage);
      this._listeners.forEach(listener => listener(usage));
    } catch (error) {
      console.warn('dsportal: the slice gauges could not be read:', (error as Error).message);
    }
    window.setTimeout(() => void this._read(), delay * 1000);
  }

  private _check(usage: Usage): void {
    const memory = usage.memory;
    const warnAt = usage.memory_warning_fraction;
    if (warnAt > 0 && memory.fraction >= warnAt && !this._warned) {
      this._warned = true;
      void this.notify(
        `Your session uses ${bytes(memory.used_bytes)} of the ${bytes(memory.limit_bytes)} of memory its slice holds ` +
          `(${Math.round(memory.fraction * 100)} %). Past the limit, the process that asks for more (usually a kernel) ` +
          'is stopped and loses its variables. Free memory you no longer need (del, shut down kernels you do not use), ' +
          'or save your work.',
        'warning'
      );
    } else if (memory.fraction < warnAt - 0.05) {
      this._warned = false; // below again: warn again next time
    }
    const over = usage.gpus.find(overShare);
    if (over && !this._warnedShare) {
      this._warnedShare = true;
      void this.notify(
        `Your session holds ${bytes(over.own_memory_bytes)} of GPU ${over.index}'s memory, more than its share ` +
          `(${shareName(over)}: about ${bytes(over.share_memory_bytes)}). Other sessions share this GPU: when together ` +
          'they ask for more than it has, whoever asks last gets an out-of-memory error, you or them. ' +
          'Use smaller batches, free tensors you no longer need, or start a session with a whole GPU.',
        'warning'
      );
    } else if (!over) {
      this._warnedShare = false;
    }
    for (const death of usage.kernel_deaths) {
      if (death.by_memory_limit && death.at >= this._since) {
        this.outOfMemory(death.kernel_id, death.at, death.message);
      }
    }
  }

  usage: Usage | null = null;
  private _listeners: ((usage: Usage) => void)[] = [];
  private _warned = false;
  private _warnedShare = false;
  private _told = new Map<string, number>(); // kernel id -> when its death was told (s)
  private _since = Date.now() / 1000 - 300; // deaths before this page opened (5 min) were told elsewhere
}

/** The status bar item: use against the slice's limits; red from the warning threshold; click: the panel. */
export class UsageStatus extends Widget {
  constructor(watch: UsageWatch, open: () => void) {
    super();
    this.addClass('dsportal-UsageStatus');
    this.addClass('jp-StatusBar-TextItem');
    this.node.textContent = 'Mem …';
    this.node.style.cursor = 'pointer';
    this.node.addEventListener('click', open);
    watch.listen(usage => this._show(usage));
  }

  private _show(usage: Usage): void {
    this.node.textContent = summary(usage);
    this.toggleClass('dsportal-mod-warn', usage.memory_warning_fraction > 0 && usage.memory.fraction >= usage.memory_warning_fraction);
    this.node.title =
      `Your slice: memory ${bytes(usage.memory.used_bytes)} of ${bytes(usage.memory.limit_bytes)}` +
      (usage.memory.limit_from === 'node' ? " (no job limit: the node's memory)" : " (the job's limit)") +
      `, CPU ${cores(usage.cpu.used_cores)} of ${cores(usage.cpu.cores)} cores` +
      (usage.gpus.length ? `, ${usage.gpus.length} GPU(s)` : ', no GPU') +
      '. Click for details.';
  }
}

function bar(fraction: number, warnAt: number): string {
  const percent = Math.max(0, Math.min(100, Math.round(fraction * 100)));
  const warn = warnAt > 0 && fraction >= warnAt ? ' dsportal-mod-warn' : '';
  return `<div class="dsportal-Gauge-bar${warn}"><div style="width: ${percent}%"></div></div>`;
}

function escape(text: string): string {
  const node = document.createElement('span');
  node.textContent = text;
  return node.innerHTML;
}

/** The panel: each gauge with its limit and where the limit comes from, and the kernels the limit killed. */
export class UsagePanel extends Widget {
  constructor(watch: UsageWatch) {
    super();
    this.id = 'dsportal-usage';
    this.title.label = 'My slice';
    this.title.closable = true;
    this.addClass('dsportal-UsagePanel');
    this.node.innerHTML = '<p>Reading your slice…</p>';
    watch.listen(usage => this._show(usage));
  }

  private _show(usage: Usage): void {
    const memory = usage.memory;
    const limitFrom = memory.limit_from === 'cgroup' ? "your job's memory limit (Slurm)" : "the node's memory: this server has no job limit";
    const coresFrom = { quota: 'CPU quota', cpuset: 'the cores it may run on', slurm: "Slurm's allocation" }[usage.cpu.cores_from] ?? usage.cpu.cores_from;
    let html =
      `<h3>Your session${usage.job_id ? ` (Slurm job ${escape(usage.job_id)})` : ''}</h3>` +
      `<p><b>Memory</b> ${bytes(memory.used_bytes)} of ${bytes(memory.limit_bytes)} (${Math.round(memory.fraction * 100)} %), ` +
      `the limit being ${limitFrom}.</p>${bar(memory.fraction, usage.memory_warning_fraction)}` +
      `<p><b>CPU</b> ${cores(usage.cpu.used_cores)} of ${cores(usage.cpu.cores)} cores busy (${coresFrom}).</p>` +
      bar(usage.cpu.cores ? usage.cpu.used_cores / usage.cpu.cores : 0, 0);
    if (!usage.gpus.length) {
      html += '<p><b>GPUs</b> none: this slice has no GPU.</p>';
    }
    for (const gpu of usage.gpus) {
      html += `<p><b>GPU ${gpu.index}</b> ${escape(gpu.name)}: `;
      if (gpu.utilization_percent === null) {
        html += `no reading (${escape(gpu.error)}).</p>`;
        continue;
      }
      if (gpu.share) {
        const mine = gpu.share_memory_bytes ? (gpu.own_memory_bytes ?? 0) / gpu.share_memory_bytes : 0;
        html +=
          `your share, ${shareName(gpu)} of it. Your processes hold ${bytes(gpu.own_memory_bytes)} of its memory, ` +
          `of about ${bytes(gpu.share_memory_bytes)} meant for your share (not enforced: ${bytes(gpu.memory_used_bytes)} ` +
          `of ${bytes(gpu.memory_total_bytes)} in use by every session on it). It is ${gpu.utilization_percent} % busy, ` +
          'all sessions on it together; they take turns.</p>' +
          bar(gpu.utilization_percent / 100, 0) + bar(mine, 1);
        continue;
      }
      const used = gpu.memory_total_bytes ? (gpu.memory_used_bytes ?? 0) / gpu.memory_total_bytes : 0;
      html +=
        `${gpu.utilization_percent} % busy, memory ${bytes(gpu.memory_used_bytes)} of ${bytes(gpu.memory_total_bytes)}.</p>` +
        bar(gpu.utilization_percent / 100, 0) + bar(used, 0);
    }
    const killed = usage.kernel_deaths.filter(death => death.by_memory_limit);
    if (killed.length) {
      html += `<h3>Stopped by the memory limit</h3><ul>${killed
        .map(death => `<li>${new Date(death.at * 1000).toLocaleTimeString()}: ${escape(death.kernel_name)}</li>`)
        .join('')}</ul>`;
    }
    this.node.innerHTML = html;
  }
}
