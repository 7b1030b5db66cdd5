// The Jobs panel, docked in JupyterLab's main area: launch a multi-node job (Horovod/MPI or
// torchrun), list mine with their state, follow one job's log live with a rank filter, cancel.
// Everything goes through the session's REST API and websocket (portal/session/jobs_api.py), which
// check each request against the user's launch policy: this panel only offers what may pass.
import { Widget } from '@lumino/widgets';
import { Message } from '@lumino/messaging';

import { api, state, streamUrl } from './api';

interface Profile {
  name: string;
  display_name: string;
  gpu_choices: number[];
  default_gpus: number;
  jobs: { default_walltime: string };
}

interface Image {
  name: string;
  display_name: string;
  profiles: string[];
}

interface Policy {
  profiles: Profile[];
  default_profile: string;
  images: Image[];
}

export interface Job {
  job_id: number;
  name: string;
  state: string;
  reason: string;
  exit_code: string;
  nodes: number;
  ranks: number;
  image: string | null;
  description: string;
  finished: boolean;
  session: string;
  session_job: number | null;
  from_this_session: boolean;
}

type StreamEvent =
  | { type: 'job'; job: Job }
  | { type: 'line'; rank: number | null; stream: string; line: string }
  | { type: 'state'; state: string; exit_code: string; reason: string };

const REFRESH_MS = 5000;

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: { [key: string]: string } = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === 'text') {
      node.textContent = value;
    } else {
      node.setAttribute(key, value);
    }
  }
  node.append(...children);
  return node;
}

function field(label: string, control: HTMLElement): HTMLLabelElement {
  return element('label', { class: 'dsportal-Jobs-field' }, element('span', { text: label }), control);
}

function option(select: HTMLSelectElement, value: string, text: string): void {
  select.append(element('option', { value, text }));
}

export class JobsPanel extends Widget {
  constructor() {
    super();
    this.id = 'dsportal-jobs';
    this.addClass('dsportal-Jobs');
    this.title.label = 'Jobs';
    this.title.caption = 'Multi-node jobs: launch, follow every rank live, cancel';
    this.title.closable = true;

    const c = this._controls;
    c.script.placeholder = 'train.py (in your home)';
    c.script.required = true;
    c.nodes.type = 'number';
    c.nodes.min = '1';
    c.nodes.value = '2';
    c.walltime.placeholder = '01:00:00';
    option(c.launcher, 'mpi', 'MPI (Horovod)');
    option(c.launcher, 'torchrun', 'torchrun (torch.distributed)');
    for (const control of Object.values(c)) {
      control.classList.add('jp-mod-styled');
    }
    c.profile.onchange = () => this._showProfile();
    const submit = element('button', { type: 'submit', class: 'jp-Button jp-mod-styled jp-mod-accept', text: 'Launch job' });
    this._form.append(
      field('Script', c.script),
      field('Partition profile', c.profile),
      field('Nodes', c.nodes),
      field('GPUs per node', c.gpus_per_node),
      field('Launcher', c.launcher),
      field('Image', c.image),
      field('Walltime', c.walltime),
      element('div', { class: 'dsportal-Jobs-submit' }, submit)
    );
    this._form.onsubmit = event => {
      event.preventDefault();
      void this._launch();
    };
    this._rankFilter.classList.add('jp-mod-styled');
    this._rankFilter.onchange = () => this._applyFilter();
    this._resetFilter(0);

    const table = element(
      'table',
      { class: 'dsportal-Jobs-table' },
      element('thead', {}, element('tr', {}, ...['Job', 'Name', 'State', 'Nodes', 'Ranks', 'Image', 'Session', ''].map(h => element('th', { text: h })))),
      this._rows
    );
    this.node.append(
      element(
        'section',
        {},
        element('h2', { text: 'Launch a multi-node job' }),
        element(
          'p',
          { class: 'dsportal-Jobs-hint' },
          'One rank per GPU on each node, inside the image if you pick one. In a notebook: ',
          element('code', { text: '%%horovod --nodes 2 --gpus-per-node 2' }),
          ' or ',
          element('code', { text: '%%torchrun --nodes 2 --gpus-per-node 2' }),
          '.'
        ),
        this._form,
        this._message
      ),
      element('section', {}, element('h2', { text: 'My jobs' }), element('div', { class: 'dsportal-Jobs-tableScroll' }, table)),
      element(
        'section',
        { class: 'dsportal-Jobs-logSection' },
        element('div', { class: 'dsportal-Jobs-logHeader' }, this._logTitle, field('Show', this._rankFilter), this._logState),
        this._log
      )
    );
    this._message.setAttribute('role', 'status');
    this._log.setAttribute('aria-live', 'polite');
  }

  /** Follow one job's log (replayed from its start, then live). */
  follow(jobId: number): void {
    this._socket?.close();
    this._log.textContent = '';
    this._following = jobId;
    for (const row of Array.from(this._rows.rows)) {
      row.classList.toggle('dsportal-mod-following', row.dataset.jobId === String(jobId));
    }
    this._logTitle.textContent = `Log of job ${jobId}`;
    this._logState.textContent = '';
    this._logState.className = 'dsportal-Jobs-logState';
    const known = this._jobs.get(jobId);
    this._resetFilter(known ? known.ranks : 0);
    const socket = new WebSocket(streamUrl(jobId));
    this._socket = socket;
    socket.onmessage = message => {
      if (this._socket === socket) {
        this._onEvent(jobId, JSON.parse(message.data) as StreamEvent);
      }
    };
    socket.onerror = () => {
      if (this._socket === socket) {
        this._append(null, 'error', `(the log of job ${jobId} could not be followed: the session's server did not answer)`);
      }
    };
  }

  dispose(): void {
    this._socket?.close();
    window.clearInterval(this._timer);
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (!this._policy) {
      void this._loadPolicy();
    }
    void this.refresh();
    this._timer = window.setInterval(() => {
      if (this.isVisible) {
        void this.refresh();
      }
    }, REFRESH_MS);
  }

  protected onBeforeDetach(msg: Message): void {
    window.clearInterval(this._timer);
    super.onBeforeDetach(msg);
  }

  async refresh(): Promise<void> {
    let jobs: Job[];
    try {
      jobs = (await api<{ jobs: Job[] }>('GET', 'jobs')).jobs;
    } catch (error) {
      this._say((error as Error).message, 'error');
      return;
    }
    this._jobs = new Map(jobs.map(job => [job.job_id, job]));
    this._rows.textContent = '';
    for (const job of jobs) {
      const row = this._rows.insertRow();
      row.dataset.jobId = String(job.job_id);
      row.classList.toggle('dsportal-mod-following', job.job_id === this._following);
      for (const value of [job.job_id, job.name, job.state, job.nodes, job.ranks, job.image || '-']) {
        row.insertCell().textContent = String(value);
      }
      row.cells[2].className = `dsportal-state dsportal-state-${job.state.split(' ')[0]}`;
      row.cells[2].title = job.reason ? `${job.state} (${job.reason})` : job.state;
      // Which of the user's sessions launched it (she may run several at once).
      const launchedFrom = job.from_this_session
        ? 'this one'
        : job.session_job === null
          ? '-'
          : `${job.session || 'default'} (job ${job.session_job})`;
      row.insertCell().textContent = launchedFrom;
      const actions = row.insertCell();
      const view = element('button', { class: 'jp-Button jp-mod-styled jp-mod-reject dsportal-Jobs-view', text: 'Log' });
      view.onclick = () => this.follow(job.job_id);
      actions.append(view);
      if (!job.finished) {
        const cancel = element('button', { class: 'jp-Button jp-mod-styled jp-mod-warn dsportal-Jobs-cancel', text: 'Cancel' });
        cancel.onclick = () => void this._cancel(job.job_id);
        actions.append(cancel);
      }
    }
    if (this._following !== null && this._jobs.has(this._following) && !this._logState.textContent?.includes('exit code')) {
      this._logState.textContent = this._jobs.get(this._following)!.state;
    }
    state.jobs = jobs.length;
  }

  private async _loadPolicy(): Promise<void> {
    try {
      this._policy = await api<Policy>('GET', 'policy');
    } catch (error) {
      this._say(`Jobs cannot be launched from this session: ${(error as Error).message}`, 'error');
      return;
    }
    const profile = this._controls.profile;
    profile.textContent = '';
    for (const p of this._policy.profiles) {
      option(profile, p.name, p.display_name);
    }
    profile.value = this._policy.default_profile;
    this._showProfile();
    state.jobsPolicy = true;
  }

  private _showProfile(): void {
    const c = this._controls;
    const profile = this._policy?.profiles.find(p => p.name === c.profile.value);
    if (!profile || !this._policy) {
      return;
    }
    c.gpus_per_node.textContent = '';
    c.image.textContent = '';
    for (const n of profile.gpu_choices) {
      option(c.gpus_per_node, String(n), String(n));
    }
    c.gpus_per_node.value = String(profile.default_gpus);
    option(c.image, '', 'session Python (no container)');
    for (const image of this._policy.images) {
      if (!image.profiles.length || image.profiles.includes(profile.name)) {
        option(c.image, image.name, image.display_name);
      }
    }
    c.walltime.placeholder = profile.jobs.default_walltime;
  }

  private async _launch(): Promise<void> {
    const c = this._controls;
    const request: { [key: string]: unknown } = {
      script: c.script.value.trim(),
      profile: c.profile.value,
      nodes: Number(c.nodes.value),
      gpus_per_node: Number(c.gpus_per_node.value),
      launcher: c.launcher.value
    };
    if (c.image.value) {
      request.image = c.image.value;
    }
    if (c.walltime.value.trim()) {
      request.walltime = c.walltime.value.trim();
    }
    this._say('Submitting…', 'info');
    try {
      const { job } = await api<{ job: Job }>('POST', 'jobs', request);
      this._say(`Submitted job ${job.job_id}: ${job.description}`, 'ok');
      this._jobs.set(job.job_id, job);
      this.follow(job.job_id);
      await this.refresh();
    } catch (error) {
      this._say((error as Error).message, 'error');
    }
  }

  private async _cancel(jobId: number): Promise<void> {
    try {
      await api('DELETE', `jobs/${jobId}`);
      this._say(`Job ${jobId} is being cancelled.`, 'ok');
    } catch (error) {
      this._say((error as Error).message, 'error');
    }
    await this.refresh();
  }

  private _onEvent(jobId: number, event: StreamEvent): void {
    if (event.type === 'job') {
      this._jobs.set(jobId, event.job);
      this._resetFilter(event.job.ranks);
      this._logState.textContent = event.job.state;
    } else if (event.type === 'line') {
      this._append(event.rank, event.stream, event.line);
    } else if (event.type === 'state') {
      const text = `job ${jobId}: ${event.state} (exit code ${event.exit_code || '-'})`;
      this._append(null, 'state', text);
      this._logState.textContent = text;
      this._logState.className = `dsportal-Jobs-logState dsportal-state dsportal-state-${event.state.split(' ')[0]}`;
      void this.refresh();
    }
  }

  private _append(rank: number | null, stream: string, text: string): void {
    const who = rank === null ? 'batch' : String(rank);
    const line = element('div', {
      class: `dsportal-Jobs-line dsportal-Jobs-${stream}`,
      'data-rank': who,
      text: stream === 'state' || stream === 'error' ? text : `[${rank === null ? 'batch' : `rank ${rank}`}] ${text}`
    });
    line.hidden = !this._shows(who, stream);
    const log = this._log;
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 5;
    log.append(line);
    if (atEnd) {
      log.scrollTop = log.scrollHeight;
    }
  }

  private _shows(who: string, stream: string): boolean {
    const wanted = this._rankFilter.value;
    return wanted === 'all' || stream === 'state' || stream === 'error' || who === wanted;
  }

  private _resetFilter(ranks: number): void {
    const select = this._rankFilter;
    const kept = select.value || 'all';
    select.textContent = '';
    option(select, 'all', 'all ranks');
    option(select, 'batch', 'batch script');
    for (let rank = 0; rank < ranks; rank++) {
      option(select, String(rank), `rank ${rank}`);
    }
    select.value = Array.from(select.options).some(o => o.value === kept) ? kept : 'all';
    this._applyFilter();
  }

  private _applyFilter(): void {
    for (const line of Array.from(this._log.children) as HTMLElement[]) {
      const stream = line.classList.contains('dsportal-Jobs-state') ? 'state' : line.classList.contains('dsportal-Jobs-error') ? 'error' : '';
      line.hidden = !this._shows(line.dataset.rank || 'batch', stream);
    }
  }

  private _say(text: string, kind: 'info' | 'ok' | 'error'): void {
    this._message.textContent = text;
    this._message.className = `dsportal-Jobs-message dsportal-Jobs-${kind}`;
  }

  private _controls = {
    script: element('input', { name: 'script' }),
    profile: element('select', { name: 'profile' }),
    nodes: element('input', { name: 'nodes' }),
    gpus_per_node: element('select', { name: 'gpus_per_node' }),
    launcher: element('select', { name: 'launcher' }),
    image: element('select', { name: 'image' }),
    walltime: element('input', { name: 'walltime' })
  };
  private _form = element('form', { class: 'dsportal-Jobs-form' });
  private _message = element('div', { class: 'dsportal-Jobs-message' });
  private _rows = element('tbody');
  private _logTitle = element('h2', { text: 'Log' });
  private _logState = element('span', { class: 'dsportal-Jobs-logState' });
  private _rankFilter = element('select', { class: 'dsportal-Jobs-rankFilter' });
  private _log = element('div', { class: 'dsportal-Jobs-log' });
  private _policy: Policy | null = null;
  private _jobs = new Map<number, Job>();
  private _following: number | null = null;
  private _socket: WebSocket | null = null;
  private _timer = 0;
}
